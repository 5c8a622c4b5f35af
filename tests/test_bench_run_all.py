"""benchmarks/run_all.py without running any benchmark: extractors, targets, JSON and table.

Each extractor reads a small hand-written JSON shaped like its script's real output (the
fields it reads, as the scripts write them; see benchmarks/out/*.json). No subprocess runs.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

# Loaded by path, once per process (the module defines absl flags at import: a second
# execution would define them twice); registered first, as dataclasses look it up there.
if "bench_run_all" not in sys.modules:
  _spec = importlib.util.spec_from_file_location("bench_run_all",
                                                 REPO / "benchmarks" / "run_all.py")
  sys.modules["bench_run_all"] = importlib.util.module_from_spec(_spec)
  _spec.loader.exec_module(sys.modules["bench_run_all"])
run_all = sys.modules["bench_run_all"]

BERT = {"benchmark": "minilm_encode", "sentences": 2000, "batch_size": 64,
        "ours_sentences_per_s": 98.0, "reference_sentences_per_s": 49.0, "ratio": 2.0,
        "target": 1.0, "min_cosine": 0.9999998, "repeats": 3}
CLIP = {"benchmark": "clip_image_encoding", "batch": 32, "ours_images_per_s": 4.0,
        "reference_images_per_s": 5.0, "ratio_ours_over_reference": 0.8, "target_ratio": 1.0,
        "cpu_time_ratio_reference_over_ours": 1.37, "max_abs_diff": 3.1e-6}
SEARCH = {"benchmark": "search_top_k", "num_docs": 2792639, "num_queries": 2442, "k": 10,
          "dim": 384, "best": {"ours": {"seconds": 210.0, "cpu_seconds": 78.6,
                                        "peak_rss_gb": 2.52},
                               "faiss": {"seconds": 195.0, "cpu_seconds": 81.2,
                                         "peak_rss_gb": 6.79}},
          "ratio": 195.0 / 210.0, "cpu_time_ratio": 1.03, "target": 0.8,
          "agreement": {"queries_with_different_ids": 0, "k": 10}}
_VERIFY_RUN = {"claims_per_s": 0.0, "cpu_ms_per_claim": 20.0, "median_wall_s": 1.4}
VERIFY = {"benchmark": "verify", "target": 1.0, "train": {
    "runs": {"ours": dict(_VERIFY_RUN, claims_per_s=108.0),
             "torch_per_claim": dict(_VERIFY_RUN, claims_per_s=45.0),
             "torch_batched": dict(_VERIFY_RUN, claims_per_s=120.0),
             "torch_batched_1thread": dict(_VERIFY_RUN, claims_per_s=56.0)},
    "batch": 32, "ratio_vs_batched": 0.9, "cpu_ratio_vs_batched": 1.05}}


def _bart_train_size(size: str, ours: float, ref: float) -> dict:
  run = lambda tps, best: {"target_tokens_per_s": tps, "tokens_per_s": 3 * tps,  # noqa: E731
                           "best_s": best, "seconds": [best]}
  return {"size": size, "d_model": 256, "runs": {"ours": run(ours, 4.0),
                                                 "reference": run(ref, 3.0),
                                                 "ours_reinforce": run(ours / 2, 8.0)},
          "ratio": ours / ref, "cpu_ratio": 0.77, "first_loss_relative_diff": 2.1e-7,
          "reinforce": {"baseline": "greedy", "cost_vs_nll": 2.0}}


BART_TRAIN = {"benchmark": "bart_train", "batch": 8, "source_length": 128, "target_length": 64,
              "torch_threads": 1, "target_ratio": 1.0,
              "results": [_bart_train_size("small", 128.0, 216.0),
                          _bart_train_size("base", 15.0, 15.0)]}
BART = {"benchmark": "bart_decoding", "mode": "greedy", "batch": 8, "source_length": 128,
        "new_tokens": 64, "results": [
            {"size": "base", "ours_tokens_per_s": 135.6, "reference_tokens_per_s": 84.8,
             "ratio": 1.6, "identical_rows": 1.0},
            {"size": "small", "ours_tokens_per_s": 2000.0, "reference_tokens_per_s": 900.0,
             "ratio": 2.22, "identical_rows": 0.5}]}
BART_BEAM_400 = dict(BART, mode="beam 4", max_length=401)
BART_SAMPLE = dict(BART, mode="sampling")
TRAINER = {"benchmark": "trainer", "overhead": {
    "variant": "small", "mesh": "data=8", "log_every": 50,
    "trainer": {"median_ms": 145.5, "cpu_median_ms": 106.0},
    "bare": {"median_ms": 151.5, "cpu_median_ms": 100.0},
    "overhead_paired_median": -0.078, "overhead_cpu_paired_median": 0.012,
    "target_overhead": 0.05}}



def _contrastive_part(size: str, ours: float, ref: float, **fields) -> dict:
  run = lambda ex: {"examples_per_s": ex, "median_s": 1.0, "seconds": [1.0]}  # noqa: E731
  return {"size": size, "batch": 32, "runs": {"ours": run(ours), "reference": run(ref)},
          "ratio": ours / ref, "cpu_ratio": 1.1, "first_loss_relative_diff": 1.1e-7,
          **fields}


CONTRASTIVE = {"benchmark": "contrastive", "parts": ["text", "clip"], "torch_threads": 2,
               "text": _contrastive_part("minilm", 6.0, 5.0, query_length=40, doc_length=64,
                                         hard_negatives=True),
               "clip": [_contrastive_part("small", 300.0, 200.0, symmetric=False),
                        _contrastive_part("base", 1.0, 2.0, symmetric=True)]}
GEMM = {"benchmark": "gemm", "shapes": [
    {"shape": "bart_ffn_in", "kind": "forward", "ratio": 0.8},
    {"shape": "bart_ffn_in", "kind": "weight_gradient", "ratio": 1.25, "plain_ratio": 0.5}],
    "summary": {"ours_gflops": 300.0, "reference_gflops": 300.0, "ratio": 1.0,
                "max_relative_difference": 7.1e-7}}
_DATA_STEP = {"seconds": 7.4, "peak_gb": 0.02, "error": None}
DATA = {"scale": "paper", "steps": {
    "read_kb": dict(_DATA_STEP, rows=2804810, chars=10**8, skipped=0),
    "read_kb_pandas": dict(_DATA_STEP, seconds=1.85, peak_gb=0.74, rows=2804810),
    "tfds": dict(_DATA_STEP, seconds=414.0)}}

def test_met_reads_the_targets():
  assert run_all.met(1.0, ">= 1.0x") is True and run_all.met(0.99, ">= 1.0x") is False
  assert run_all.met(1.04, "< 1.05x") is True and run_all.met(1.05, "< 1.05x") is False
  assert run_all.met(2.0, None) is None and run_all.met(None, ">= 2.0x") is None
  with pytest.raises(ValueError):
    run_all.met(1.0, "about 1x")


def test_extractors_read_each_scripts_json():
  (bert,) = run_all.extract_bert(BERT)
  assert (bert["ours"], bert["reference"], bert["unit"]) == (98.0, 49.0, "sent/s")
  assert bert["ratio"] == 2.0 and bert["target"] == ">= 1.0x" and bert["met"] is True
  assert "2,000 sentences" in bert["name"] and bert["peak_rss_gb"] is None

  (clip,) = run_all.extract_clip(CLIP)
  assert clip["ratio"] == pytest.approx(0.8) and clip["met"] is False

  (search,) = run_all.extract_search(SEARCH)
  assert search["ours"] == pytest.approx(2442 / 210.0) and search["unit"] == "queries/s"
  # ours / reference in queries/s is the script's own ratio (faiss seconds / ours seconds).
  assert search["ratio"] == pytest.approx(SEARCH["ratio"]) and search["met"] is True
  assert search["target"] == ">= 0.8x" and "differ on 0 of 2,442" in search["note"]

  batched, per_claim = run_all.extract_verify(VERIFY)
  assert batched["ratio"] == pytest.approx(0.9) and batched["met"] is False
  assert per_claim["ratio"] == pytest.approx(2.4) and per_claim["met"] is None

  rows = run_all.extract_bart_train(BART_TRAIN)
  assert [r["name"].split(" step")[0] for r in rows] == [
      "BART small NLL training", "BART small REINFORCE", "BART base NLL training",
      "BART base REINFORCE"]
  assert rows[0]["ratio"] == pytest.approx(128 / 216) and rows[0]["met"] is False
  assert rows[2]["ratio"] == 1.0 and rows[2]["met"] is True
  # REINFORCE: its cost relative to our NLL step (seconds), no target.
  assert rows[1]["ratio"] == 2.0 and rows[1]["unit"] == "s/step" and rows[1]["met"] is None

  base, small = run_all.extract_bart(BART, "bart_greedy")
  assert base["benchmark"] == "bart_greedy" and "greedy decoding" in base["name"]
  assert base["met"] is False and small["met"] is True and small["target"] == ">= 2.0x"
  assert "50%" in small["note"]
  assert "max_length" not in base["name"]  # Older JSON has none: the limit was new + 1.
  assert "max_length" not in run_all.extract_bart(dict(BART, max_length=65), "b")[0]["name"]
  long_base, _ = run_all.extract_bart(BART_BEAM_400, "bart_beam_400")
  assert long_base["name"] == ("BART base beam 4 decoding, batch 8, 64 new tokens "
                               "(max_length 401)")
  sampled, _ = run_all.extract_bart(BART_SAMPLE, "bart_sample")
  assert "sampling decoding" in sampled["name"] and "differ by design" in sampled["note"]

  (trainer,) = run_all.extract_trainer(TRAINER)
  assert trainer["ratio"] == pytest.approx(1.06) and trainer["met"] is False
  assert trainer["target"] == "< 1.05x" and "+1.2%" in trainer["note"]

  text, small, base = run_all.extract_contrastive(CONTRASTIVE)
  assert text["name"].startswith("InfoNCE text step (minilm shape, batch 32, 40/64 tokens")
  assert text["ratio"] == pytest.approx(1.2) and text["met"] is True
  assert text["target"] == ">= 1.0x" and text["unit"] == "ex/s"
  assert "1.1e-07" in text["note"] and "2 torch threads" in text["note"]
  assert small["name"].startswith("CLIP contrastive step (small shape, batch 32)")
  assert base["met"] is False and "symmetric" in base["name"]
  # A text run with dropout compares no losses; a run of one part has one part's rows.
  dropout = copy.deepcopy(CONTRASTIVE)
  dropout["parts"], dropout["text"]["first_loss_relative_diff"] = ["text"], None
  (row,) = run_all.extract_contrastive(dropout)
  assert "losses not compared" in row["note"]

  (gemm,) = run_all.extract_gemm(GEMM)
  assert gemm["ratio"] == 1.0 and gemm["met"] is None and gemm["unit"] == "GFLOP/s"
  assert gemm["name"] == "float32 matrix products, geometric mean of 2"
  assert gemm["note"] == ("bart_ffn_in forward 0.80x; bart_ffn_in weight_gradient 1.25x "
                          "(plain dot 0.50x); max rel. diff 7.1e-07")
  (data,) = run_all.extract_data(DATA)
  assert data["ratio"] == pytest.approx(7.4 / 1.85) and data["met"] is None
  assert data["unit"] == "s" and "2,804,810-sentence KB (paper world)" in data["name"]
  assert "target < 60 s and < 4 GB: met" in data["note"]
  no_pandas = copy.deepcopy(DATA)
  no_pandas["steps"]["read_kb_pandas"] = {"error": "skipped: No module named 'pandas'"}
  (row,) = run_all.extract_data(no_pandas)
  assert row["reference"] is None and row["ratio"] is None and "pandas" in row["note"]


def test_every_benchmark_has_an_extractor_for_its_example():
  examples = {"bert": BERT, "clip": CLIP, "search": SEARCH, "verify": VERIFY,
              "bart_train": BART_TRAIN, "bart_greedy": BART, "bart_sample": BART_SAMPLE,
              "bart_beam": BART, "bart_beam_400": BART_BEAM_400, "trainer": TRAINER,
              "contrastive": CONTRASTIVE, "gemm": GEMM, "data": DATA}
  assert set(examples) == set(run_all.BY_NAME)
  for name, data in examples.items():
    rows = run_all.BY_NAME[name].extract(data)
    assert rows and all(r["benchmark"] == name for r in rows)


@pytest.mark.parametrize("extract, data, path, key", [
    (run_all.extract_bert, BERT, ("ours_sentences_per_s",), "'ours_sentences_per_s'"),
    (run_all.extract_search, SEARCH, ("best", "faiss", "seconds"), "'best.faiss.seconds'"),
    (run_all.extract_bart_train, BART_TRAIN, ("results", 1, "runs", "ours_reinforce"),
     "'results.1.runs.ours_reinforce.best_s'"),
    (run_all.extract_trainer, TRAINER, ("overhead",), "'overhead.overhead_cpu_paired_median'"),
    (run_all.extract_contrastive, CONTRASTIVE, ("clip", 1, "runs", "reference"),
     "'clip.1.runs.reference.examples_per_s'"),
])
def test_a_missing_key_names_the_script_and_the_key(extract, data, path, key):
  data = copy.deepcopy(data)
  node = data
  for part in path[:-1]:
    node = node[part]
  del node[path[-1]]
  with pytest.raises(run_all.ExtractError) as e:
    extract(data)
  script = {run_all.extract_bert: "bench_bert.py", run_all.extract_search: "bench_search.py",
            run_all.extract_bart_train: "bench_bart_train.py",
            run_all.extract_trainer: "bench_trainer.py",
            run_all.extract_contrastive: "bench_contrastive.py"}[extract]
  assert str(e.value).startswith(f"{script}: key {key} is missing"), str(e.value)


def test_a_null_figure_is_an_error_too():
  with pytest.raises(run_all.ExtractError, match=r"bench_clip.py: key 'ours_images_per_s' is "
                     r"None, not a number"):
    run_all.extract_clip(dict(CLIP, ours_images_per_s=None))


def test_figures_of_attaches_the_peak_and_reports_a_missing_file(tmp_path):
  path = tmp_path / "bert.json"
  path.write_text(json.dumps(BERT))
  bench = run_all.BY_NAME["bert"]
  (row,) = run_all.figures_of(bench, {"peak_rss_gb": 1.25}, str(path))
  assert row["peak_rss_gb"] == 1.25
  with pytest.raises(run_all.ExtractError, match="bench_bert.py: no readable JSON"):
    run_all.figures_of(bench, {"peak_rss_gb": 1.0}, str(tmp_path / "absent.json"))


def test_commands_pass_quick_sizes_and_the_output_path(tmp_path):
  out = str(tmp_path / "bart_beam.json")
  quick = run_all.command(run_all.BY_NAME["bart_beam"], True, out)
  full = run_all.command(run_all.BY_NAME["bart_beam"], False, out)
  assert quick[1].endswith("benchmarks/bench_bart.py") and quick[-1] == f"--out={out}"
  assert "--num_beams=4" in quick and "--num_beams=4" in full
  assert "--repeats=1" in quick and full[2:] == ["--num_beams=4", f"--out={out}"]
  assert "--num_docs=200000" in run_all.command(run_all.BY_NAME["search"], True, out)
  for bench in run_all.BENCHMARKS:
    assert (REPO / "benchmarks" / bench.script).exists(), bench.script
  assert [b.name for b in run_all.selected(["trainer", "bert"])] == ["bert", "trainer"]
  assert len(run_all.selected([])) == len(run_all.BENCHMARKS)
  with pytest.raises(Exception, match="unknown benchmark"):
    run_all.selected(["bert", "gpu"])


def test_results_json_and_table(tmp_path):
  figures = run_all.extract_bert(BERT) + run_all.extract_bart(BART, "bart_greedy")
  for f in figures:
    f["peak_rss_gb"] = 1.5
  machine = dict(cpu_count=2, usable_cpus=2, platform="Linux", python="3.11",
                 versions={"jax": "0.10.2", "torch": "2.13.0", "transformers": "5.24.0"},
                 load_average_start=[3.0, 2.0, 1.0], load_average_end=[4.5, 3.0, 2.0])
  failures = [dict(name="search", exit_code=1, timed_out=False, seconds=12.0,
                   stderr_tail=["Traceback ...", "faiss is not installed", ""]),
              dict(name="clip", exit_code=0, timed_out=False, seconds=5.0,
                   error="bench_clip.py: key 'batch' is missing from its JSON (no 'batch')",
                   stderr_tail=[]),
              dict(name="trainer", exit_code=-9, timed_out=True, seconds=900.0,
                   stderr_tail=[])]
  results = dict(machine=machine, quick=True, runs=[], figures=figures, failures=failures)
  results_path, table_path = tmp_path / "r" / "results.json", tmp_path / "t" / "table.md"
  table = run_all.write_outputs(results, str(results_path), str(table_path))

  assert json.loads(results_path.read_text()) == results
  assert table_path.read_text() == table
  lines = table.splitlines()
  assert "load average 3.0 -> 4.5" in lines[0] and "QUICK MODE" in lines[0]
  assert lines[2] == "| figure | ours | reference | ratio | target | met | peak RSS |"
  rows = [ln for ln in lines if ln.startswith("| ") and "---" not in ln][1:]
  assert rows[0] == ("| MiniLM encoding, 2,000 sentences, batch 64 | 98.0 sent/s | "
                     "sentence-transformers 49.0 sent/s | 2.000x | >= 1.0x | yes | 1.50 GB |")
  assert rows[1].endswith("| 1.599x | >= 2.0x | **no** | 1.50 GB |")
  assert "| 2,000 tok/s |" in rows[2] and len(rows) == 3
  assert "- search: exit code 1 (last stderr line: `faiss is not installed`)" in lines
  assert "- clip: bench_clip.py: key 'batch' is missing from its JSON (no 'batch')" in lines
  assert "- trainer: timed out after 900 s" in lines


@pytest.mark.parametrize("value, kept", [("1", True), ("0", False), (None, False)])
def test_the_table_says_when_freed_memory_was_kept(monkeypatch, value, kept):
  if value is None:
    monkeypatch.delenv(run_all.host_memory.ENV_VAR, raising=False)
  else:
    monkeypatch.setenv(run_all.host_memory.ENV_VAR, value)
  machine = run_all.machine_info()
  assert machine["keep_freed_memory"] is kept
  machine["load_average_end"] = machine["load_average_start"]
  header = run_all.markdown_table(dict(machine=machine, quick=False, figures=[],
                                       failures=[])).splitlines()[0]
  assert ("MOCHEG_JAX_KEEP_FREED_MEMORY=1" in header) is kept


@pytest.mark.parametrize("value", ["glibc", None])
def test_the_table_names_the_allocator_the_benchmarks_run_under(monkeypatch, value):
  if value is None:
    monkeypatch.delenv(run_all.allocator.ENV_VAR, raising=False)
  else:
    monkeypatch.setenv(run_all.allocator.ENV_VAR, value)
  machine = run_all.machine_info()
  expected = "glibc" if value else run_all.allocator.planned()
  if value is None and sys.platform.startswith("linux"):
    assert expected == "mimalloc"  # The dependency ships the library on Linux.
  assert machine["malloc"] == expected
  machine["load_average_end"] = machine["load_average_start"]
  header = run_all.markdown_table(dict(machine=machine, quick=False, figures=[],
                                       failures=[])).splitlines()[0]
  assert f"; malloc: {expected}" in header


def test_the_table_names_the_cpu_and_its_vector_instructions(tmp_path):
  cpuinfo = tmp_path / "cpuinfo"
  cpuinfo.write_text("processor\t: 0\nmodel name\t: Example Xeon 9\n"
                     "flags\t\t: fpu sse2 avx avx2 avx512f avx512bw amx_tile\n\n"
                     "processor\t: 1\nmodel name\t: Example Xeon 9\nflags\t\t: fpu\n")
  assert run_all.cpu_description(str(cpuinfo)) == dict(model="Example Xeon 9",
                                                       isa=["avx2", "avx512f", "amx_tile"])
  assert run_all.cpu_description(str(tmp_path / "missing"))["isa"] == []
  machine = run_all.machine_info()
  machine.update(cpu=dict(model="Example Xeon 9", isa=["avx2"]),
                 load_average_end=machine["load_average_start"])
  header = run_all.markdown_table(dict(machine=machine, quick=False, figures=[],
                                       failures=[])).splitlines()[0]
  assert header.startswith(f"Example Xeon 9 (avx2) x{machine['cpu_count']}, load average")
