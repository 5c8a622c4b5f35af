"""The main job's report on a hand-made WORKDIR: tables, runs and metrics written here, the
qrels from a tiny synthetic release; nothing is trained."""

from __future__ import annotations

import json
import math
import os

import pytest

from mocheg_jax.data.mocheg import MochegRelease
from mocheg_jax.data.report import MochegInputError
from mocheg_jax.data.synthetic import write_world
from mocheg_jax.metrics import trec
from mocheg_jax.pipeline import report
from mocheg_jax.retrieval import table3

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CONFUSION = {"gold": [[3, 1, 1], [5, 0, 0], [0, 1, 4]],
             "system": [[2, 3, 0], [1, 4, 0], [2, 3, 0]]}
# modality -> the Table 3 system whose run runs/MODALITY.run holds.
SYSTEMS = {"text": "SBERT + rerank", "image": "CLIP + text articles (top 2)"}
# The image run is the grounded ranking the retrieval stage chose.
SUMMARY = {"scale": "tiny", "seed": 0,
           "timings_s": {"prepare": 1.5, "kb_stats": 0.5, "retrieval": 12.25},
           # "-" where a step has no figure: "prepare" absent, "kb_stats" None.
           "peak_resident_gb": {"retrieval": 3.25, "kb_stats": None},
           "retrieval_system_image": {"articles": 2, "system": SYSTEMS["image"],
                                      "best_grounded": 2, "metric": "dev/recall@5",
                                      "dev": {"CLIP fine-tuned": 0.1, SYSTEMS["image"]: 0.5}}}


@pytest.fixture(scope="module")
def release(tmp_path_factory):
  root = tmp_path_factory.mktemp("world")
  write_world(root, "tiny", seed=0, workers=0, progress=False)
  return str(root)


def _ranked(topic_index: int, relevant: list[str], modality: str) -> list[tuple[str, float]]:
  """10 items, best first: the relevant ones at ranks i % 4, then every third rank after
  it; fillers elsewhere. Scores fall by 1 per rank, as a retriever's would."""
  first = topic_index % 4
  slots = iter(relevant)
  out = []
  for rank in range(10):
    doc = next(slots, None) if rank >= first and (rank - first) % 3 == 0 else None
    out.append((doc or f"filler-{modality}-{topic_index}-{rank}", 10.0 - rank))
  return out


def _by_hand(qrels: dict, run: dict, k: int) -> float:
  """Mean over the topics with a relevant item of (relevant in the top k) / |relevant|;
  a topic the run lacks scores 0."""
  scores = []
  for topic, judged in qrels.items():
    relevant = {d for d, rel in judged.items() if rel == 1}
    if relevant:
      top = [d for d, _ in run.get(topic, [])[:k]]
      scores.append(sum(d in relevant for d in top) / len(relevant))
  return sum(scores) / len(scores)


def _write_json(path, value) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(value, f)


def _write_text(path, text: str) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)


def _metrics_lines(records: list[dict]) -> str:
  return "".join(json.dumps(r) + "\n" for r in records)


@pytest.fixture
def workdir(tmp_path, release):
  """A finished main job's files, small and hand-written, around the synthetic release."""
  wd = tmp_path / "work"
  wd.mkdir()
  os.symlink(release, wd / "release")
  rel = MochegRelease(release)
  claim_ids = [str(c.claim_id) for c in rel.claims("test")]
  qrels, runs = {}, {}
  (wd / "runs").mkdir()
  for modality, system in SYSTEMS.items():
    q = {str(k): v for k, v in getattr(rel, f"{modality}_qrels")("test").items()}
    topics = sorted(t for t in q if any(r == 1 for r in q[t].values()))
    # The first topic is left out of the run: it must count 0, as in Table 3.
    run = {t: _ranked(i, sorted(d for d, r in q[t].items() if r == 1), modality)
           for i, t in enumerate(topics) if i > 0}
    trec.write_run(wd / "runs" / f"{modality}.run", run, "test")
    qrels[modality], runs[modality] = q, run
  rows = (table3.table3_rows("SBERT + rerank", {"text": runs["text"]}, qrels,
                             claim_ids=claim_ids)
          + table3.table3_rows(SYSTEMS["image"], {"image": runs["image"]}, qrels,
                               claim_ids=claim_ids))
  table3.write_rows(wd / "table3.json", rows)
  _write_text(wd / "table3.md", table3.format_table(rows) + "\n")
  table4 = [{"system": "Majority", "evidence": "-", "macro_f1": 0.17,
             "confusion_matrix": [[5, 0, 0], [5, 0, 0], [5, 0, 0]]}]
  table4 += [{"system": "Stance (text+image)", "evidence": e, "macro_f1": 0.4,
              "confusion_matrix": m} for e, m in CONFUSION.items()]
  _write_json(wd / "table4.json", table4)
  _write_text(wd / "table4.md", "| System | Evidence | Macro F1 |\n|---|---|---:|\n"
              "| Stance (text+image) | gold | 40.00 |\n")
  # BLEU NaN: Python's json writes the non-standard NaN token; the report must not.
  _write_json(wd / "table5.json", [{"system": "BART", "rougeL": 0.2, "bleu": math.nan}])
  _write_text(wd / "table5.md", "| System | ROUGE-L |\n|---|---:|\n| BART | 20.00 |\n")
  _write_text(wd / "stages" / "retrieval_text" / "metrics.jsonl", _metrics_lines([
      {"step": 10, "loss": 2.0, "learning_rate": 1e-3},
      {"step": 20, "loss": 1.0},
      {"step": 20, "dev/recall@5": 0.5, "dev/recall@10": 0.75, "dev/tokens": 80.0},
      {"step": 30, "loss": "nan"},
      {"step": 40, "loss": 0.5},
      {"step": 40, "dev/recall@5": 0.6, "dev/recall@10": 0.8, "dev/tokens": 70.0}]))
  _write_text(wd / "stages" / "verify_text_image" / "metrics.jsonl", _metrics_lines([
      {"step": 5, "loss": 1.1}, {"step": 10, "loss": 0.9}]))
  os.makedirs(wd / "stages" / "explain_nll" / "checkpoints")  # Started, never logged.
  return str(wd), qrels, runs, rows


def _strict(text: str):
  def refuse(token):
    raise ValueError(f"non-standard JSON constant {token}")
  return json.loads(text, parse_constant=refuse)


def test_report_end_to_end(workdir):
  wd, qrels, runs, rows = workdir
  lines = []
  results = report.write_report(wd, dict(SUMMARY), log=lines.append)

  with open(os.path.join(wd, "results.json"), encoding="utf-8") as f:
    on_disk = _strict(f.read())
  assert on_disk == results
  assert (on_disk["scale"], on_disk["seed"]) == ("tiny", 0)
  assert on_disk["timings_s"] == SUMMARY["timings_s"]
  assert on_disk["peak_resident_gb"] == SUMMARY["peak_resident_gb"]
  assert on_disk["table5"][0]["bleu"] is None
  assert "/table5/0/bleu" in on_disk["non_finite_as_null"]
  assert on_disk["table4"][1]["confusion_matrix"] == CONFUSION["gold"]
  assert on_disk["explanation_classifier"] is None  # Absent from the summary.

  for modality, system in SYSTEMS.items():
    curve = on_disk["recall_at_k"][modality]
    assert curve["k"] == list(range(1, 11))
    for k in range(1, 11):
      assert curve["recall"][k - 1] == pytest.approx(_by_hand(qrels[modality],
                                                              runs[modality], k))
    table = {r["k"]: r["recall"] for r in rows if r["system"] == system}
    assert curve["recall"][4] == table[5] and curve["recall"][9] == table[10]  # Exactly.
    assert curve["matches_table3"] is True
    assert curve["num_missing"] == 1
    assert 0 < curve["recall"][9] < 1

  plot_files = [p["file"] for p in on_disk["plots"]]
  assert sorted(plot_files) == sorted([
      "plots/recall_at_k.png", "plots/confusion_stance_text_image.png",
      "plots/training_retrieval_text.png", "plots/training_verify_text_image.png"])
  for name in plot_files:
    with open(os.path.join(wd, name), "rb") as f:
      assert f.read(8) == PNG_SIGNATURE
  assert sorted(os.listdir(os.path.join(wd, "plots"))) == sorted(
      os.path.basename(p) for p in plot_files)

  with open(os.path.join(wd, "report.md"), encoding="utf-8") as f:
    md = f.read()
  for table in ("table3.md", "table4.md", "table5.md"):
    with open(os.path.join(wd, table), encoding="utf-8") as f:
      assert f.read().strip() in md
  for name in plot_files:
    assert f"]({name})" in md
  assert "| retrieval | 12.25 | 3.25 |" in md
  assert "| prepare | 1.5 | - |" in md and "| kb_stats | 0.5 | - |" in md
  assert "timings count only what it did again" in md  # What a rerun's timings mean.

  skipped = {s["input"]: s["reason"] for s in on_disk["skipped"]}
  assert "stages/rerank/metrics.jsonl" in skipped  # Never run.
  assert "stages/explain_nll/metrics.jsonl" in skipped  # Folder without metrics.
  assert "stages/retrieval_text/metrics.jsonl" not in skipped
  assert len(lines) == len(skipped) + 1  # One line per skipped input, one at the end.
  assert on_disk["training"]["retrieval_text"]["last_loss"] == 0.5
  assert on_disk["training"]["retrieval_text"]["last_dev"]["dev/recall@10"] == 0.8
  assert not [n for n in os.listdir(wd) if n.endswith(".tmp")]


def test_missing_stage_outputs_are_skipped(workdir):
  wd, *_ = workdir
  for name in ("table5.json", "table5.md", os.path.join("runs", "image.run")):
    os.remove(os.path.join(wd, name))
  summary = dict(SUMMARY, explanation_classifier={"claims": 15, "macro_f1": 0.8,
                                                  "f1/NEI": math.inf})
  results = report.write_report(wd, summary, log=lambda line: None)
  skipped = [s["input"] for s in results["skipped"]]
  assert {"table5.json", "table5.md", "runs/image.run"} <= set(skipped)
  assert results["table5"] is None
  assert list(results["recall_at_k"]) == ["text"]
  assert results["explanation_classifier"] == {"claims": 15, "macro_f1": 0.8, "f1/NEI": None}
  with open(os.path.join(wd, "report.md"), encoding="utf-8") as f:
    md = f.read()
  assert "table5.md missing" in md and "`runs/image.run`" in md
  assert "macro_f1 0.8000" in md


@pytest.mark.parametrize("content, detail", [
    ("[{\"system\": ", "not valid JSON"),
    ("{\"rows\": []}", "list of row objects"),
    (json.dumps([{"system": "Stance (text+image)", "evidence": "gold",
                  "confusion_matrix": [[1, 2], [3, 4]]}]), "confusion_matrix"),
])
def test_malformed_table4_is_an_error_naming_it(workdir, content, detail):
  wd, *_ = workdir
  _write_text(os.path.join(wd, "table4.json"), content)
  with pytest.raises(MochegInputError, match=detail) as error:
    report.write_report(wd, dict(SUMMARY), log=lambda line: None)
  assert os.path.join(wd, "table4.json") in str(error.value)
  assert not os.path.exists(os.path.join(wd, "results.json"))  # No half report.
