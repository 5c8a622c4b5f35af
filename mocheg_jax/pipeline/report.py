"""The main job's report: WORKDIR/results.json, WORKDIR/report.md and WORKDIR/plots/*.png.

`write_report` runs after every stage has finished and only reads what the stages wrote:
the tables (table3/4/5 .json and .md), the TREC runs of the reranked text retriever and the
image retriever with the release's test qrels, and each trained stage's metrics.jsonl.

An input that is absent (a stage that was not run) is skipped: one logged line, and an
entry under "skipped" in results.json and report.md, so a partial run still gets a report
that says what it lacks. An input that is present but malformed is an error naming the file
(`MochegInputError`): a report drawn from a half-read table would look complete and be wrong.
Every file is written atomically (tmp + os.replace), so a crash never leaves half a report.
"""

from __future__ import annotations

import json
import math
import os
from typing import Callable

import numpy as np

from mocheg_jax.data.labels import NUM_CLASSES
from mocheg_jax.data.mocheg import MochegRelease
from mocheg_jax.data.report import MochegInputError
from mocheg_jax.metrics import retrieval as retrieval_metrics
from mocheg_jax.metrics import trec
from mocheg_jax.pipeline import plots
from mocheg_jax.retrieval.stage import describe_choice
from mocheg_jax.train import evaluations, writer
from mocheg_jax.utils import files
from mocheg_jax.verification import stage as verification_stage

RESULTS_JSON, REPORT_MD, PLOTS_DIR = "results.json", "report.md", "plots"
TABLES = {  # results.json key -> (file stem, markdown heading)
    "table3": ("table3", "Table 3: evidence retrieval (test split)"),
    "table4": ("table4", "Table 4: claim verification (test split)"),
    "table5": ("table5", "Table 5: explanation generation (test split)"),
}
SPLIT = "test"  # The split every stage's table scores.
CURVE_KS = tuple(range(1, 11))  # The runs keep 10 items per claim (retrieval/stage.py).
# modality -> (run file under WORKDIR, the Table 3 system that wrote it). The image run is
# the ranking the retrieval stage chose (the summary's retrieval_system_image), the paper's
# global one when the summary does not say.
RUNS = {"text": (os.path.join("runs", "text.run"), "SBERT + rerank"),
        "image": (os.path.join("runs", "image.run"), "CLIP fine-tuned")}
CONFUSION_SYSTEM = "Stance (text+image)"  # The Table 4 row whose confusion is plotted.
# The folders the main job trains into (retrieval/, verification/ and explanation/stage.py);
# one that is absent is listed as skipped, so a report shows which trainings did not run.
STAGES = ("retrieval_text", "rerank", "captions", "retrieval_image",
          *(mode.folder for mode in verification_stage.MODES.values()),
          "explain_classifier", "explain_nll", "explain_reinforce")


def _write_atomic(path: str, data: bytes | str) -> None:
  with files.atomic_open(path, "wb") as f:
    f.write(data.encode("utf-8") if isinstance(data, str) else data)


def _plain(value, where: str, nulled: list[str]):
  """`value` as plain JSON data; non-finite floats become null and their paths are listed.

  Strict JSON has no NaN or Infinity (Python writes the non-standard `NaN` token, which
  JSON.parse and most other readers reject), so they are written as null; the list of
  their paths keeps such a null apart from a figure that was never computed.
  """
  if isinstance(value, dict):
    return {str(k): _plain(v, f"{where}/{k}", nulled) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_plain(v, f"{where}/{i}", nulled) for i, v in enumerate(value)]
  if isinstance(value, (np.ndarray, np.generic)):
    return _plain(value.tolist(), where, nulled)
  if isinstance(value, float) and not math.isfinite(value):
    nulled.append(where)
    return None
  if value is None or isinstance(value, (bool, int, float, str)):
    return value
  raise TypeError(f"{where}: {type(value).__name__} is not JSON data")


class _Skips:
  """Absent inputs: each logged once and kept for results.json and report.md."""

  def __init__(self, workdir: str, log: Callable[[str], None]):
    self.workdir, self.log, self.items = workdir, log, []

  def __call__(self, path: str, reason: str) -> None:
    rel = os.path.relpath(path, self.workdir)
    self.items.append({"input": rel, "reason": reason})
    self.log(f"report: skipped {rel}: {reason}")


def _read_rows(path: str, skip: _Skips) -> list[dict] | None:
  """A table's JSON rows, or None (skipped) when the file is absent."""
  if not os.path.isfile(path):
    skip(path, "missing (the stage that writes it did not run)")
    return None
  try:
    with open(path, encoding="utf-8") as f:
      rows = json.load(f)  # Accepts NaN; _plain turns it into null.
  except (ValueError, UnicodeDecodeError) as e:
    raise MochegInputError(f"{path}: not valid JSON ({e})") from None
  if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
    raise MochegInputError(f"{path}: expected a JSON list of row objects")
  return rows


def _read_text(path: str, skip: _Skips) -> str | None:
  if not os.path.isfile(path):
    skip(path, "missing (the stage that writes it did not run)")
    return None
  with open(path, encoding="utf-8") as f:
    return f.read().strip()


def recall_curves(workdir: str, release_dir: str, skip: _Skips,
                  image_system: str | None = None) -> dict[str, dict]:
  """modality -> recall@K for K = 1..10 of the run the Table 3 system wrote (`image_system`:
  the image run's, when not RUNS' default).

  The same `evaluate_run` as Table 3 (`retrieval/table3.py`) on the same qrels, so the
  curve's @5 and @10 are that table's rows; run order is read back exactly (`read_run`).
  """
  curves, release = {}, None
  for modality, (name, system) in RUNS.items():
    if modality == "image":
      system = image_system or system
    path = os.path.join(workdir, name)
    if not os.path.isfile(path):
      skip(path, f"missing: no {modality} recall@K curve")
      continue
    if release is None:
      if not os.path.isdir(release_dir):
        skip(release_dir, "missing: no qrels, so no recall@K curves")
        return curves
      release = MochegRelease(release_dir)
    qrels = getattr(release, f"{modality}_qrels")(SPLIT)
    m = retrieval_metrics.evaluate_run({str(k): v for k, v in qrels.items()},
                                       trec.read_run(path), ks=CURVE_KS)
    curves[modality] = {"system": system, "run": name, "k": list(CURVE_KS),
                        "recall": [m[f"R@{k}"] for k in CURVE_KS],
                        "num_scored": m["num_queries"], "num_missing": m["num_missing"]}
  return curves


def _check_table3(curves: dict, table3: list[dict] | None, log) -> None:
  """Records whether each curve meets its Table 3 row at K = 5 and 10 (it should)."""
  for modality, curve in curves.items():
    rows = {r.get("k"): r for r in table3 or ()
            if r.get("system") == curve["system"] and r.get("modality") == modality}
    same = [rows[k].get("recall") == curve["recall"][k - 1] for k in (5, 10) if k in rows]
    curve["matches_table3"] = all(same) if same else None
    if same and not all(same):
      log(f"report: the {modality} recall@K curve differs from Table 3's "
          f"{curve['system']!r} rows (was the run rewritten after the table?)")


def _confusions(path: str, rows: list[dict] | None, skip: _Skips) -> dict[str, list]:
  """evidence ("gold", "system") -> the CONFUSION_SYSTEM row's checked 3x3 matrix."""
  out = {}
  for evidence in ("gold", "system"):
    row = next((r for r in rows or () if r.get("system") == CONFUSION_SYSTEM
                and r.get("evidence") == evidence), None)
    if row is None:
      if rows is not None:
        skip(path, f"no {CONFUSION_SYSTEM!r} row with {evidence} evidence: no confusion plot")
      continue
    matrix = row.get("confusion_matrix")
    if not (isinstance(matrix, list) and len(matrix) == NUM_CLASSES and all(
        isinstance(r, list) and len(r) == NUM_CLASSES
        and all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in r)
        for r in matrix)):
      raise MochegInputError(
          f"{path}: {CONFUSION_SYSTEM} ({evidence} evidence): confusion_matrix must be "
          f"{NUM_CLASSES}x{NUM_CLASSES} non-negative integers, got {str(matrix)[:100]}")
    out[evidence] = matrix
  return out


def _training(workdir: str, skip: _Skips) -> dict[str, dict]:
  """stage folder -> {"records", "dev_keys"} for every stage with a metrics file."""
  root = os.path.join(workdir, "stages")
  found = sorted(os.listdir(root)) if os.path.isdir(root) else []
  out = {}
  for stage in STAGES + tuple(s for s in found if s not in STAGES):
    folder = os.path.join(root, stage)
    if not os.path.isfile(os.path.join(folder, writer.METRICS_FILE)):
      if stage in STAGES or os.path.isdir(folder):
        skip(os.path.join(folder, writer.METRICS_FILE), "missing: stage not trained")
      continue
    records = writer.read_metrics(folder)  # MochegInputError names a corrupt file.
    dev_keys = list(dict.fromkeys(k for r in records for k in r if k.startswith("dev/")))
    if not any("loss" in r for r in records) and not dev_keys:
      skip(os.path.join(folder, writer.METRICS_FILE), "no loss or dev/ metrics to plot")
      continue
    out[stage] = {"records": records, "dev_keys": dev_keys}
  return out


def _last(records: list[dict], key: str):
  values = [r[key] for r in records if key in r]
  return values[-1] if values else None


def _markdown(results: dict, texts: dict[str, str | None]) -> str:
  lines = ["# Mocheg-JAX main job report", "",
           f"Scale `{results['scale']}`, seed {results['seed']}, matrix products at "
           f"{results['matmul_precision'] or 'JAX default'} precision. Figures are on the "
           f"test split of the release in `{results['release']}`.", ""]
  if results["timings_s"]:
    peaks = results["peak_resident_gb"]
    lines += ["## Timings", "", "| Step | Seconds | Peak resident GiB |", "|---|---:|---:|"]
    lines += [f"| {k} | {v} | {'-' if peaks.get(k) is None else peaks[k]} |"
              for k, v in results["timings_s"].items()]
    lines += ["", "A rerun of the job reuses finished trainings and evaluations "
              f"(`{evaluations.RECORDS_DIR}/`): its timings count only what it did again. "
              "The peak is the process's resident memory at its highest during the step "
              "(`explanation.NAME`: one training of that stage); the stages share one "
              "process, so what one leaves held counts in the next.", ""]
  for key, (_, heading) in TABLES.items():
    lines += [f"## {heading}", "", texts[key] or f"Not available ({key}.md missing).", ""]
    if key == "table3":
      for modality, curve in results["recall_at_k"].items():
        cells = ", ".join(f"@{k} {100 * r:.2f}" for k, r in zip(curve["k"], curve["recall"]))
        lines.append(f"Recall@K, {modality} ({curve['system']}): {cells}.")
      lines.append("")
      for modality in ("text", "image"):
        if results[f"system_{modality}"]:
          lines += [f"System {modality} evidence (Tables 4 and 5, the fact-checker): "
                    f"{describe_choice(results[f'system_{modality}'])}.", ""]
    if key == "table5" and results["explanation_classifier"]:
      scores = results["explanation_classifier"]
      figures = ", ".join(  # "-": a figure that was not a number (null in results.json).
          f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {'-' if v is None else v}"
          for k, v in scores.items() if not isinstance(v, (list, dict)))
      lines += [f"Truthfulness classifier (the reward model) on the gold explanations: "
                f"{figures}.", ""]
    for plot in results["plots"]:
      if plot["section"] == key:
        lines += [f"![{plot['title']}]({plot['file']})", ""]
  trained = [p for p in results["plots"] if p["section"] == "training"]
  if trained:
    lines += ["## Training curves", ""]
    for plot in trained:
      lines += [f"### {plot['title']}", "", f"![{plot['title']}]({plot['file']})", ""]
  if results["skipped"]:
    lines += ["## Skipped inputs", ""]
    lines += [f"- `{s['input']}`: {s['reason']}" for s in results["skipped"]]
    lines.append("")
  return "\n".join(lines)


def write_report(workdir: str, summary: dict, log: Callable[[str], None] = print) -> dict:
  """Writes results.json, report.md and plots/*.png into `workdir`; returns the results.

  Args:
    workdir: the main job's folder, after its stages have run.
    summary: the main job's summary: "scale", "seed", "timings_s", "peak_resident_gb" (per
      step, like the timings), "release" (the release folder; default WORKDIR/release)
      and, when the explanation stage ran, "explanation_classifier" (the classifier's test
      scores).
    log: where the skipped inputs are reported, one line each.

  Raises:
    MochegInputError: an input file exists but is malformed (the message names it).
  """
  workdir = os.fspath(workdir)
  skip = _Skips(workdir, log)
  rows = {key: _read_rows(os.path.join(workdir, f"{stem}.json"), skip)
          for key, (stem, _) in TABLES.items()}
  texts = {key: _read_text(os.path.join(workdir, f"{stem}.md"), skip)
           for key, (stem, _) in TABLES.items()}
  release_dir = summary.get("release") or os.path.join(workdir, "release")
  curves = recall_curves(workdir, release_dir, skip,
                         (summary.get("retrieval_system_image") or {}).get("system"))
  _check_table3(curves, rows["table3"], log)
  confusions = _confusions(os.path.join(workdir, "table4.json"), rows["table4"], skip)
  training = _training(workdir, skip)

  plot_dir = os.path.join(workdir, PLOTS_DIR)
  os.makedirs(plot_dir, exist_ok=True)
  plot_list = []

  def save(name: str, png: bytes, section: str, title: str) -> None:
    _write_atomic(os.path.join(plot_dir, name), png)
    plot_list.append({"file": f"{PLOTS_DIR}/{name}", "section": section, "title": title})

  if curves:
    save("recall_at_k.png", plots.recall_curves(curves), "table3", "Recall@K, test split")
  if confusions:
    save("confusion_stance_text_image.png", plots.confusion_matrices(
        {f"{e} evidence": m for e, m in confusions.items()}, CONFUSION_SYSTEM), "table4",
         f"Confusion matrices, {CONFUSION_SYSTEM}")
  for stage, t in training.items():
    save(f"training_{stage}.png", plots.training_curves(stage, t["records"], t["dev_keys"]),
         "training", f"Training: {stage}")

  nulled: list[str] = []
  results = _plain({
      "scale": summary.get("scale"), "seed": summary.get("seed"),
      "release": release_dir, "matmul_precision": summary.get("matmul_precision", ""),
      "timings_s": summary.get("timings_s", {}),
      "peak_resident_gb": summary.get("peak_resident_gb", {}),
      **rows,
      "explanation_classifier": summary.get("explanation_classifier"),
      "system_text": summary.get("retrieval_system_text"),
      "system_image": summary.get("retrieval_system_image"),
      "recall_at_k": curves,
      "training": {stage: {"steps": len(t["records"]),
                           "last_step": _last(t["records"], "step"),
                           "last_loss": _last(t["records"], "loss"),
                           "last_dev": {k: _last(t["records"], k) for k in t["dev_keys"]}}
                   for stage, t in training.items()},
      "plots": plot_list,
      "skipped": skip.items,
  }, "", nulled)
  results["non_finite_as_null"] = nulled
  _write_atomic(os.path.join(workdir, RESULTS_JSON),
                json.dumps(results, indent=1, allow_nan=False) + "\n")
  _write_atomic(os.path.join(workdir, REPORT_MD), _markdown(results, texts) + "\n")
  log(f"report: wrote {RESULTS_JSON}, {REPORT_MD} and {len(plot_list)} plots in {workdir}")
  return results
