r"""The CPU benchmark suite: every side-by-side benchmark, one table of ours vs the reference.

  python benchmarks/run_all.py                       # each script at its own (full) sizes
  python benchmarks/run_all.py --quick               # smoke sizes: the suite in minutes
  python benchmarks/run_all.py --only=bert,search    # a subset (names: BENCHMARKS below)

Runs each benchmark script of benchmarks/ as a subprocess, one after another (never two at
once: they would share the cores and spoil each other's timings), with its JSON written to
--out_dir/<name>.json and its stdout / stderr to --out_dir/<name>.stdout / .stderr. Default
mode passes no size flags, so every script runs at its own defaults (the figures that go in
BENCHMARKS.md); --quick passes small sizes, which only checks that the suite works end to end
(its ratios say little: compilation and per-call overheads dominate at those sizes).

Each subprocess has a timeout (--timeout_s, else a per-benchmark default). A benchmark that
fails, times out, or whose JSON lacks a field the suite reads is recorded as a failure (name,
exit code, the last lines of its stderr or the extraction error) and the suite goes on; the
exit status is non-zero at the end if any failed.

Peak memory: the max RSS of the benchmark's process tree, from os.wait4 on the child (Linux
reports the largest RSS of the child and of any descendant it waited for: bench_search.py's
two sides run as its own subprocesses, data_bench.py's steps too). Where ours and the
reference run in the same process (every script but those two) this is the peak of both
sides together.

From each JSON, one small extractor per script takes the figures: name, ours, reference,
unit, ratio = ours / reference (for throughputs > 1 means we are faster; for times, such as
the trainer's ms/step, < 1 does), the target from issue 9 (e.g. ">= 1.0x"), met (null where
there is no target) and the peak RSS. Writes --results (JSON: machine, quick, figures,
failures, and every run's command, time and exit code), prints a markdown table and writes it
to --table_out, ready to paste into BENCHMARKS.md.
"""

from __future__ import annotations

if __name__ == "__main__":  # First: a re-exec keeps nothing done before it.
  from mocheg_jax.utils import allocator
  allocator.run_under_preferred_allocator()

import dataclasses
import importlib.metadata
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Sequence

from absl import app, flags

from mocheg_jax.utils import allocator, host_memory

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_HERE = os.path.join(_REPO, "benchmarks")

_QUICK = flags.DEFINE_boolean("quick", False, "Small sizes for every benchmark (a smoke check "
                              "in minutes) instead of each script's own defaults.")
_ONLY = flags.DEFINE_list("only", [], "Run only these benchmarks (default: all).")
_OUT_DIR = flags.DEFINE_string("out_dir", os.path.join(_HERE, "out", "run_all"),
                               "Where each benchmark's JSON and logs go.")
_RESULTS = flags.DEFINE_string("results", os.path.join(_HERE, "results.json"),
                               "The suite's JSON results file.")
_TABLE_OUT = flags.DEFINE_string("table_out", os.path.join(_HERE, "out", "run_all", "table.md"),
                                 "The markdown table (for BENCHMARKS.md).")
_TIMEOUT = flags.DEFINE_float("timeout_s", None, "Per-benchmark timeout in seconds (default: "
                              "each benchmark's own, see BENCHMARKS; 600 s each with --quick).")

# Issue 9's CPU targets, as conditions on ratio = ours / reference.
ENCODING_TARGET = ">= 1.0x"  # MiniLM and CLIP encoding vs sentence-transformers / transformers.
SEARCH_TARGET = ">= 0.8x"  # Throughput vs faiss IndexFlatIP.
TRAINING_TARGET = ">= 1.0x"  # Training steps vs PyTorch.
DECODING_TARGET = ">= 2.0x"  # Decoding vs transformers generate.
OVERHEAD_TARGET = "< 1.05x"  # Trainer < 5% over a bare jitted step (time per step).
QUICK_TIMEOUT_S = 600.0  # Smoke sizes took 12-45 s each at load ~5 on 2 cores.
STDERR_LINES = 20  # Kept per failure.


class ExtractError(ValueError):
  """A benchmark's JSON lacks what the suite reads (the message names the script and key)."""


# ---- reading a benchmark's JSON -------------------------------------------------------------
def _get(data: Any, script: str, path: str) -> Any:
  """data[a][b][0]... for path "a.b.0"; a missing key names the script and the whole path."""
  node = data
  for part in path.split("."):
    if isinstance(node, list) and part.isdigit() and int(part) < len(node):
      node = node[int(part)]
    elif isinstance(node, dict) and part in node:
      node = node[part]
    else:
      raise ExtractError(f"{script}: key {path!r} is missing from its JSON (no {part!r})")
  return node


def _number(data: Any, script: str, path: str) -> float:
  """A figure must be a number: a null or a string is as bad as a missing key."""
  value = _get(data, script, path)
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise ExtractError(f"{script}: key {path!r} is {value!r}, not a number")
  return float(value)


def met(ratio: float | None, target: str | None) -> bool | None:
  """Whether ratio satisfies a target such as ">= 1.0x" or "< 1.05x" (None: no target)."""
  if target is None or ratio is None:
    return None
  m = re.fullmatch(r"(>=|<=|>|<)\s*([0-9.]+)x", target)
  if not m:
    raise ValueError(f"bad target {target!r}")
  bound = float(m.group(2))
  return {">=": ratio >= bound, "<=": ratio <= bound, ">": ratio > bound,
          "<": ratio < bound}[m.group(1)]


def figure(benchmark: str, name: str, ours: float, reference: float, unit: str,
           reference_name: str, target: str | None, note: str = "") -> dict[str, Any]:
  """One row of the suite's table; peak_rss_gb is filled in by the caller (per run)."""
  ratio = ours / reference if reference else None
  return dict(benchmark=benchmark, name=name, ours=ours, reference=reference, unit=unit,
              reference_name=reference_name, ratio=ratio, target=target,
              met=met(ratio, target), note=note, peak_rss_gb=None)


# ---- one extractor per script ---------------------------------------------------------------
def extract_bert(data: dict) -> list[dict]:
  s = "bench_bert.py"
  n, batch = int(_number(data, s, "sentences")), int(_number(data, s, "batch_size"))
  return [figure("bert", f"MiniLM encoding, {n:,} sentences, batch {batch}",
                 _number(data, s, "ours_sentences_per_s"),
                 _number(data, s, "reference_sentences_per_s"), "sent/s",
                 "sentence-transformers", ENCODING_TARGET,
                 f"min cosine {_number(data, s, 'min_cosine'):.6f}")]


def extract_clip(data: dict) -> list[dict]:
  s = "bench_clip.py"
  batch = int(_number(data, s, "batch"))
  return [figure("clip", f"CLIP ViT-B/32 image encoding, batch {batch} (random weights)",
                 _number(data, s, "ours_images_per_s"),
                 _number(data, s, "reference_images_per_s"), "img/s", "transformers",
                 ENCODING_TARGET,
                 f"CPU-time ratio {_number(data, s, 'cpu_time_ratio_reference_over_ours'):.2f}x;"
                 f" max |diff| {_number(data, s, 'max_abs_diff'):.1e}")]


def extract_search(data: dict) -> list[dict]:
  s = "bench_search.py"
  docs, queries = int(_number(data, s, "num_docs")), int(_number(data, s, "num_queries"))
  k, dim = int(_number(data, s, "k")), int(_number(data, s, "dim"))
  ours_s, faiss_s = _number(data, s, "best.ours.seconds"), _number(data, s, "best.faiss.seconds")
  differ = int(_number(data, s, "agreement.queries_with_different_ids"))
  note = (f"top-{k} ids differ on {differ} of {queries:,} queries; CPU-time ratio "
          f"{_number(data, s, 'cpu_time_ratio'):.2f}x; peak GB ours "
          f"{_number(data, s, 'best.ours.peak_rss_gb'):.2f} / faiss "
          f"{_number(data, s, 'best.faiss.peak_rss_gb'):.2f}")
  return [figure("search", f"exact top-{k} search, {queries:,} queries x {docs:,} x {dim}",
                 queries / ours_s, queries / faiss_s, "queries/s", "faiss IndexFlatIP",
                 SEARCH_TARGET, note)]


def extract_verify(data: dict) -> list[dict]:
  s = "bench_verify.py"
  batch = int(_number(data, s, "train.batch"))
  ours = _number(data, s, "train.runs.ours.claims_per_s")
  return [
      figure("verify", f"verifier training step, batch {batch}", ours,
             _number(data, s, "train.runs.torch_batched.claims_per_s"), "claims/s",
             "PyTorch batched", TRAINING_TARGET,
             f"CPU-time ratio {_number(data, s, 'train.cpu_ratio_vs_batched'):.2f}x"),
      figure("verify", "verifier training step vs one claim per step (as the reference runs)",
             ours, _number(data, s, "train.runs.torch_per_claim.claims_per_s"), "claims/s",
             "PyTorch per claim", None),
  ]


def extract_bart_train(data: dict) -> list[dict]:
  s = "bench_bart_train.py"
  shape = (f"batch {int(_number(data, s, 'batch'))}, {int(_number(data, s, 'source_length'))}"
           f"/{int(_number(data, s, 'target_length'))} tokens, "
           f"{int(_number(data, s, 'torch_threads'))} torch threads")
  out = []
  for i, _ in enumerate(_get(data, s, "results")):
    r = f"results.{i}"
    size = _get(data, s, f"{r}.size")
    out.append(figure(
        "bart_train", f"BART {size} NLL training step, {shape}",
        _number(data, s, f"{r}.runs.ours.target_tokens_per_s"),
        _number(data, s, f"{r}.runs.reference.target_tokens_per_s"), "target tok/s",
        "transformers", TRAINING_TARGET,
        f"first-step loss rel. diff {_number(data, s, f'{r}.first_loss_relative_diff'):.1e}; "
        f"CPU-time ratio {_number(data, s, f'{r}.cpu_ratio'):.2f}x"))
    # No PyTorch REINFORCE step exists to compare with: the figure is its cost relative to
    # our NLL step on the same batch (BENCHMARKS.md's "REINFORCE / NLL").
    out.append(figure(
        "bart_train", f"BART {size} REINFORCE step vs our NLL step, {shape}",
        _number(data, s, f"{r}.runs.ours_reinforce.best_s"),
        _number(data, s, f"{r}.runs.ours.best_s"), "s/step", "our NLL step", None,
        f"baseline {_get(data, s, f'{r}.reinforce.baseline')}"))
  return out


def extract_bart(data: dict, benchmark: str) -> list[dict]:
  s = "bench_bart.py"
  mode = _get(data, s, "mode")
  new_tokens = int(_number(data, s, "new_tokens"))
  # Scripts before --max_length wrote none: their limit was new_tokens + 1.
  max_length = int(data.get("max_length") or new_tokens + 1)
  limit = f" (max_length {max_length})" if max_length > new_tokens + 1 else ""
  out = []
  for i, _ in enumerate(_get(data, s, "results")):
    r = f"results.{i}"
    out.append(figure(
        benchmark, f"BART {_get(data, s, f'{r}.size')} {mode} decoding, batch "
        f"{int(_number(data, s, 'batch'))}, {new_tokens} new tokens{limit}",
        _number(data, s, f"{r}.ours_tokens_per_s"),
        _number(data, s, f"{r}.reference_tokens_per_s"), "tok/s", "transformers generate",
        DECODING_TARGET,
        "rows differ by design (other random generators)" if mode == "sampling" else
        f"identical rows {_number(data, s, f'{r}.identical_rows'):.0%}"))
  return out


def extract_trainer(data: dict) -> list[dict]:
  s = "bench_trainer.py"
  o = "overhead"
  # CPU time, as BENCHMARKS.md: on a shared machine the wall-time overhead is swamped by load.
  note = (f"paired median overhead: CPU {_number(data, s, f'{o}.overhead_cpu_paired_median'):+.1%}"
          f", wall {_number(data, s, f'{o}.overhead_paired_median'):+.1%}")
  return [figure("trainer", f"trainer overhead ({_get(data, s, f'{o}.variant')} contrastive "
                 f"task, {_get(data, s, f'{o}.mesh')}, log_every "
                 f"{int(_number(data, s, f'{o}.log_every'))})",
                 _number(data, s, f"{o}.trainer.cpu_median_ms"),
                 _number(data, s, f"{o}.bare.cpu_median_ms"), "CPU-ms/step",
                 "bare jitted step", OVERHEAD_TARGET, note)]


def extract_contrastive(data: dict) -> list[dict]:
  s = "bench_contrastive.py"
  threads = int(_number(data, s, "torch_threads"))

  def note(r: str) -> str:
    diff = _get(data, s, f"{r}.first_loss_relative_diff")
    check = (f"first-step loss rel. diff {_number(data, s, f'{r}.first_loss_relative_diff'):.1e}"
             if diff is not None else "losses not compared (dropout)")
    return (f"{check}; CPU-time ratio {_number(data, s, f'{r}.cpu_ratio'):.2f}x; "
            f"{threads} torch threads")

  out = []
  parts = _get(data, s, "parts")
  if "text" in parts:
    t = "text"
    negatives = " + hard negatives" if _get(data, s, f"{t}.hard_negatives") else ""
    out.append(figure(
        "contrastive", f"InfoNCE text step ({_get(data, s, f'{t}.size')} shape, batch "
        f"{int(_number(data, s, f'{t}.batch'))}, {int(_number(data, s, f'{t}.query_length'))}/"
        f"{int(_number(data, s, f'{t}.doc_length'))} tokens{negatives})",
        _number(data, s, f"{t}.runs.ours.examples_per_s"),
        _number(data, s, f"{t}.runs.reference.examples_per_s"), "ex/s",
        "PyTorch (transformers BertModel)", TRAINING_TARGET, note(t)))
  if "clip" in parts:
    for i, _ in enumerate(_get(data, s, "clip")):
      r = f"clip.{i}"
      symmetric = ", symmetric" if _get(data, s, f"{r}.symmetric") else ""
      out.append(figure(
          "contrastive", f"CLIP contrastive step ({_get(data, s, f'{r}.size')} shape, batch "
          f"{int(_number(data, s, f'{r}.batch'))}{symmetric})",
          _number(data, s, f"{r}.runs.ours.examples_per_s"),
          _number(data, s, f"{r}.runs.reference.examples_per_s"), "ex/s",
          "PyTorch (transformers CLIPModel)", TRAINING_TARGET, note(r)))
  return out


def extract_data(data: dict) -> list[dict]:
  """Reading the sentence KB, ours vs pandas.read_csv: a time ratio (< 1: we are faster);
  the target is absolute (BENCHMARKS.md: < 60 s and < 4 GB at paper scale), so in the note."""
  s = "data_bench.py"
  scale = _get(data, s, "scale")
  ours = _number(data, s, "steps.read_kb.seconds")
  rows = int(_number(data, s, "steps.read_kb.rows"))
  peak = _number(data, s, "steps.read_kb.peak_gb")
  pandas = _get(data, s, "steps.read_kb_pandas")
  reference = None if isinstance(pandas, dict) and pandas.get("error") else _number(
      data, s, "steps.read_kb_pandas.seconds")
  note = f"peak {peak:.2f} GB"
  if reference is None:
    note += f"; pandas.read_csv {pandas['error']}"
  else:
    note += f" (pandas {_number(data, s, 'steps.read_kb_pandas.peak_gb'):.2f} GB)"
  if scale == "paper":
    ok = ours < 60.0 and peak < 4.0
    note += f"; target < 60 s and < 4 GB: {'met' if ok else 'MISSED'}"
  return [figure("data", f"read the {rows:,}-sentence KB ({scale} world), time", ours, reference,
                 "s", "pandas.read_csv", None, note)]


def extract_gemm(data: dict) -> list[dict]:
  """One row: the geometric means over the products (so its ratio is the geometric mean of
  the per-product ratios); each product's ratio goes in the note. No target: it says how
  much of the other ratios is the kernels' (BENCHMARKS.md, "A second CPU")."""
  s = "bench_gemm.py"
  shapes = _get(data, s, "shapes")

  def product(i: int) -> str:
    text = (f"{_get(data, s, f'shapes.{i}.shape')} {_get(data, s, f'shapes.{i}.kind')} "
            f"{_number(data, s, f'shapes.{i}.ratio'):.2f}x")
    if shapes[i].get("plain_ratio") is not None:  # Weight gradients: the plain dot too.
      text += f" (plain dot {_number(data, s, f'shapes.{i}.plain_ratio'):.2f}x)"
    return text

  per_product = "; ".join(product(i) for i in range(len(shapes)))
  return [figure("gemm", f"float32 matrix products, geometric mean of {len(shapes)}",
                 _number(data, s, "summary.ours_gflops"),
                 _number(data, s, "summary.reference_gflops"), "GFLOP/s", "torch.matmul",
                 None, f"{per_product}; max rel. diff "
                 f"{_number(data, s, 'summary.max_relative_difference'):.1e}")]


# ---- the benchmarks -------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Benchmark:
  name: str
  script: str  # In benchmarks/.
  extract: Callable[[dict], list[dict]]
  timeout_s: float  # Full size: several times the runs in BENCHMARKS.md (loaded 2 cores).
  flags: tuple[str, ...] = ()  # Always passed.
  quick_flags: tuple[str, ...] = ()  # Passed with --quick.


BENCHMARKS = [
    Benchmark("bert", "bench_bert.py", extract_bert, 1800,
              quick_flags=("--num_sentences=64", "--batch_size=16", "--repeats=1")),
    Benchmark("clip", "bench_clip.py", extract_clip, 1800,
              quick_flags=("--batch=4", "--iters=2", "--warmup=1")),
    # Writing the 4.3 GB index takes ~100 s, each search 3-5 min, 2 repeats per side. Quick:
    # the script's own quick mode (200,000 rows, BENCHMARKS.md has a row for it), one repeat.
    Benchmark("search", "bench_search.py", extract_search, 2 * 3600,
              quick_flags=("--num_docs=200000", "--repeats=1")),
    Benchmark("verify", "bench_verify.py", extract_verify, 3600,
              quick_flags=("--parts=train", "--batch=8", "--claims=16", "--window_claims=16",
                           "--per_claim_window=2", "--rounds=2")),
    # The REINFORCE step stays on (the script's default): its figure is part of the suite.
    Benchmark("bart_train", "bench_bart_train.py", extract_bart_train, 3 * 3600,
              quick_flags=("--sizes=tiny", "--batch=2", "--source_length=16",
                           "--target_length=8", "--repeats=1")),
    Benchmark("bart_greedy", "bench_bart.py", lambda d: extract_bart(d, "bart_greedy"), 3600,
              quick_flags=("--sizes=small", "--batch=2", "--source_length=32",
                           "--new_tokens=8", "--repeats=1")),
    # Sampling from the full distribution, as the REINFORCE step samples (added 2026-12-07).
    Benchmark("bart_sample", "bench_bart.py", lambda d: extract_bart(d, "bart_sample"), 3600,
              flags=("--do_sample",),
              quick_flags=("--sizes=small", "--batch=2", "--source_length=32",
                           "--new_tokens=8", "--repeats=1")),
    Benchmark("bart_beam", "bench_bart.py", lambda d: extract_bart(d, "bart_beam"), 3600,
              flags=("--num_beams=4",),
              quick_flags=("--sizes=small", "--batch=2", "--source_length=32",
                           "--new_tokens=8", "--repeats=1")),
    # The paper's evaluation setting: beam 4 to max_length 400, texts ending long before.
    Benchmark("bart_beam_400", "bench_bart.py",
              lambda d: extract_bart(d, "bart_beam_400"), 3600,
              flags=("--num_beams=4", "--max_length=401"),
              quick_flags=("--sizes=small", "--batch=2", "--source_length=32",
                           "--new_tokens=8", "--repeats=1")),
    # The overhead part is the suite's figure; the full run also measures checkpoints and
    # mesh shapes (kept in its JSON). Quick: overhead only, two short windows.
    Benchmark("trainer", "bench_trainer.py", extract_trainer, 3 * 3600,
              quick_flags=("--parts=overhead", "--windows=2", "--log_every=10")),
    # InfoNCE text step (MiniLM shape) and CLIP step (small config, ViT-B/32 shape at batch
    # 16). Quick: tiny shapes, two rounds.
    Benchmark("contrastive", "bench_contrastive.py", extract_contrastive, 2 * 3600,
              quick_flags=("--text_size=tiny", "--clip_sizes=tiny", "--repeats=2")),
    # The models' matrix products alone (a diagnostic without a target). ~20 s.
    Benchmark("gemm", "bench_gemm.py", extract_gemm, 1800,
              quick_flags=("--shapes=tiny", "--calls=2", "--repeats=1")),
    # Paper scale: ~12 minutes of world and TFDS building around the KB reads (BENCHMARKS.md).
    Benchmark("data", "data_bench.py", extract_data, 2 * 3600, quick_flags=("--scale=tiny",)),
]
BY_NAME = {b.name: b for b in BENCHMARKS}


def command(bench: Benchmark, quick: bool, json_path: str) -> list[str]:
  return [sys.executable, os.path.join(_HERE, bench.script), *bench.flags,
          *(bench.quick_flags if quick else ()), f"--out={json_path}"]


def selected(only: Sequence[str]) -> list[Benchmark]:
  unknown = sorted(set(only) - set(BY_NAME))
  if unknown:
    raise app.UsageError(f"--only: unknown benchmark(s) {unknown}; use {', '.join(BY_NAME)}")
  return [b for b in BENCHMARKS if not only or b.name in only]


# ---- running one --------------------------------------------------------------------------
def _child_env() -> dict[str, str]:
  env = dict(os.environ)
  # bench_bart.py and bench_bert.py import mocheg_jax without adding the repository to
  # sys.path themselves.
  env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO, env.get("PYTHONPATH")) if p)
  env.setdefault("JAX_PLATFORMS", "cpu")  # A CPU suite, also on a machine with a GPU.
  env.setdefault("HF_HUB_OFFLINE", "1")
  env.setdefault("TRANSFORMERS_OFFLINE", "1")
  env["PYTHONUNBUFFERED"] = "1"  # The .stdout log can be followed while it runs.
  return env


def run(bench: Benchmark, cmd: list[str], timeout_s: float, out_dir: str) -> dict[str, Any]:
  """Runs one benchmark to completion or timeout: exit code, seconds, peak RSS, logs."""
  stdout_path = os.path.join(out_dir, f"{bench.name}.stdout")
  stderr_path = os.path.join(out_dir, f"{bench.name}.stderr")
  with open(stdout_path, "w") as out, open(stderr_path, "w") as err:
    start = time.perf_counter()
    # Its own session (process group), so a timeout also ends the subprocesses it started.
    proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=_REPO, env=_child_env(),
                            start_new_session=True)
    timed_out = False
    try:
      while True:  # wait4, not Popen.wait: only wait4 returns the child's rusage (max RSS).
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
          break
        if time.perf_counter() - start > timeout_s:
          timed_out = True
          os.killpg(proc.pid, signal.SIGKILL)
          _, status, usage = os.wait4(proc.pid, 0)
          break
        time.sleep(0.1)
    except BaseException:  # Ctrl-C: leave no benchmark running behind us.
      try:
        os.killpg(proc.pid, signal.SIGKILL)
        os.waitpid(proc.pid, 0)
      except OSError:  # Already gone (and reaped).
        pass
      proc.returncode = -signal.SIGKILL
      raise
    seconds = time.perf_counter() - start
  proc.returncode = os.waitstatus_to_exitcode(status)  # Reaped above; Popen must not wait.
  return dict(name=bench.name, command=cmd, exit_code=proc.returncode, timed_out=timed_out,
              timeout_s=timeout_s, seconds=seconds,
              peak_rss_gb=usage.ru_maxrss / 1e6,  # kB (Linux) -> GB, as the scripts report.
              stdout_log=stdout_path, stderr_log=stderr_path)


def _tail(path: str, lines: int = STDERR_LINES) -> list[str]:
  try:
    with open(path, errors="replace") as f:
      return f.read().splitlines()[-lines:]
  except OSError:
    return []


def figures_of(bench: Benchmark, result: dict[str, Any], json_path: str) -> list[dict]:
  """The figures of a finished run, each with its run's peak RSS; ExtractError if unreadable."""
  try:
    with open(json_path) as f:
      data = json.load(f)
  except (OSError, ValueError) as e:
    raise ExtractError(f"{bench.script}: no readable JSON at {json_path}: {e}") from e
  rows = bench.extract(data)
  for row in rows:
    row["peak_rss_gb"] = result["peak_rss_gb"]
  return rows


# ---- machine, results, table ----------------------------------------------------------------
def _version(package: str) -> str | None:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None


# The vector and matrix instruction sets that decide which side's kernels win: on an AVX2
# machine (AMD EPYC) our dots were on par with PyTorch's, on an AVX-512 / AMX Xeon PyTorch's
# oneDNN kernels ran 15-30% faster (BENCHMARKS.md, "A second CPU").
_ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile")


def cpu_description(cpuinfo: str = "/proc/cpuinfo") -> dict[str, Any]:
  """The CPU's model name and which of _ISA_FLAGS it has (empty where /proc is missing)."""
  try:
    with open(cpuinfo) as f:
      text = f.read()
  except OSError:
    return dict(model=platform.processor() or None, isa=[])
  fields = {}
  for line in text.splitlines():
    key, _, value = line.partition(":")
    fields.setdefault(key.strip(), value.strip())  # The first processor's.
  flags = set(fields.get("flags", "").split())
  return dict(model=fields.get("model name"), isa=[f for f in _ISA_FLAGS if f in flags])


def machine_info() -> dict[str, Any]:
  """Importing jax/torch here would cost seconds and memory; package metadata is enough."""
  return dict(cpu=cpu_description(),
              cpu_count=os.cpu_count(), usable_cpus=len(os.sched_getaffinity(0)),
              platform=platform.platform(), python=platform.python_version(),
              versions={p: _version(p) for p in ("jax", "jaxlib", "flax", "torch",
                                                 "transformers", "sentence-transformers",
                                                 "faiss-cpu")},
              load_average_start=list(os.getloadavg()),
              # The benchmarks it starts inherit the variables (host_memory.py, allocator.py).
              keep_freed_memory=host_memory.asked(), malloc=allocator.planned())


def _fmt(x: float | None) -> str:
  if x is None:
    return "-"
  if abs(x) >= 1000:
    return f"{x:,.0f}"
  if abs(x) >= 10:
    return f"{x:.1f}"
  return f"{x:.3g}"


def markdown_table(results: dict[str, Any]) -> str:
  """The table (figure | ours | reference | ratio | target | met | peak RSS), its notes,
  and the failures, as markdown."""
  m = results["machine"]
  start, end = m["load_average_start"][0], (m.get("load_average_end") or [float("nan")])[0]
  v = m["versions"]
  cpu = m.get("cpu") or {}
  described = f"{cpu.get('model') or 'CPU'} ({', '.join(cpu.get('isa') or []) or 'no AVX2'})"
  lines = [f"{described} x{m['cpu_count']}, load average {start:.1f} -> {end:.1f}; "
           f"jax {v.get('jax')}, torch {v.get('torch')}, transformers {v.get('transformers')}"
           + f"; malloc: {m.get('malloc', 'glibc')}"
           + (f"; {host_memory.ENV_VAR}=1" if m.get("keep_freed_memory") else "")
           + ("; QUICK MODE (smoke sizes: the ratios are not the benchmarks' figures)"
              if results["quick"] else ""), "",
           "| figure | ours | reference | ratio | target | met | peak RSS |",
           "|---|---|---|---|---|---|---|"]
  for f in results["figures"]:
    # Three decimals: 1.048x must not read as 1.05x against a "< 1.05x" target.
    ratio = "-" if f["ratio"] is None else f"{f['ratio']:.3f}x"
    met_ = {True: "yes", False: "**no**", None: "-"}[f["met"]]
    rss = "-" if f["peak_rss_gb"] is None else f"{f['peak_rss_gb']:.2f} GB"
    lines.append(f"| {f['name']} | {_fmt(f['ours'])} {f['unit']} | {f['reference_name']} "
                 f"{_fmt(f['reference'])} {f['unit']} | {ratio} | {f['target'] or '-'} | "
                 f"{met_} | {rss} |")
  notes = [f"- {f['name']}: {f['note']}" for f in results["figures"] if f["note"]]
  if notes:
    lines += ["", "Notes:", *notes]
  if results["failures"]:
    lines += ["", "Failed:"]
    for fail in results["failures"]:
      why = fail.get("error") or (f"timed out after {fail['seconds']:.0f} s" if
                                  fail.get("timed_out") else f"exit code {fail['exit_code']}")
      last = next((ln for ln in reversed(fail.get("stderr_tail") or []) if ln.strip()), "")
      lines.append(f"- {fail['name']}: {why}" + (f" (last stderr line: `{last}`)"
                                                  if last and not fail.get("error") else ""))
  return "\n".join(lines) + "\n"


def write_outputs(results: dict[str, Any], results_path: str, table_path: str) -> str:
  """Writes the JSON and the markdown table; returns the table."""
  table = markdown_table(results)
  for path, text in ((results_path, json.dumps(results, indent=2) + "\n"), (table_path, table)):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
      f.write(text)
  return table


# ---- the suite ------------------------------------------------------------------------------
def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  benches = selected(_ONLY.value)
  out_dir, quick = os.path.abspath(_OUT_DIR.value), _QUICK.value
  os.makedirs(out_dir, exist_ok=True)
  results: dict[str, Any] = dict(machine=machine_info(), quick=quick,
                                 started=time.strftime("%Y-%m-%d %H:%M:%S"), runs=[],
                                 figures=[], failures=[])
  for bench in benches:
    json_path = os.path.join(out_dir, f"{bench.name}.json")
    if os.path.exists(json_path):
      os.remove(json_path)  # A failed run must not leave an old run's figures to be read.
    cmd = command(bench, quick, json_path)
    timeout_s = _TIMEOUT.value or (QUICK_TIMEOUT_S if quick else bench.timeout_s)
    print(f"[{bench.name}] {' '.join(cmd[1:])}", flush=True)
    result = run(bench, cmd, timeout_s, out_dir)
    result["json"] = json_path
    results["runs"].append(result)
    status = f"{result['seconds']:.1f} s, peak RSS {result['peak_rss_gb']:.2f} GB"
    failure = None
    if result["timed_out"] or result["exit_code"]:
      failure = dict(name=bench.name, exit_code=result["exit_code"],
                     timed_out=result["timed_out"], seconds=result["seconds"],
                     stderr_tail=_tail(result["stderr_log"]))
    else:
      try:
        results["figures"] += figures_of(bench, result, json_path)
      except ExtractError as e:
        failure = dict(name=bench.name, exit_code=result["exit_code"], timed_out=False,
                       seconds=result["seconds"], error=str(e), stderr_tail=[])
    if failure:
      results["failures"].append(failure)
      why = failure.get("error") or ("timed out" if result["timed_out"]
                                     else f"exit code {result['exit_code']}")
      print(f"[{bench.name}] FAILED ({why}) after {status}; see {result['stderr_log']}",
            flush=True)
      for line in failure["stderr_tail"][-5:]:
        print(f"    {line}", flush=True)
    else:
      print(f"[{bench.name}] ok: {status}", flush=True)
  results["machine"]["load_average_end"] = list(os.getloadavg())
  results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
  table = write_outputs(results, _RESULTS.value, _TABLE_OUT.value)
  print("\n" + table, flush=True)
  print(f"-> {_RESULTS.value}, {_TABLE_OUT.value}", file=sys.stderr)
  if results["failures"]:
    sys.exit(f"{len(results['failures'])} of {len(benches)} benchmark(s) failed: "
             f"{', '.join(f['name'] for f in results['failures'])}")


if __name__ == "__main__":
  app.run(main)
