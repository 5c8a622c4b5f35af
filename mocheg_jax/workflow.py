"""The main job: synthetic world -> statistics -> tokenizers -> TFDS -> a batch per task ->
retrieval (train, index, search, Table 3) -> verification (train per evidence mode, Table 4)
-> explanation (truthfulness classifier, generators with and without the reward, Table 5)
-> the pipeline manifest (WORKDIR is then a pipeline folder for scripts/fact_check.py) ->
a few test claims fact-checked end to end.

Each step reuses what an earlier run of the same workdir already finished.
"""

from __future__ import annotations

import json
import os
import time
from typing import Callable

import jax
import numpy as np

from mocheg_jax.data import pipelines
from mocheg_jax.data import prepare as prepare_lib
from mocheg_jax.data import stats as stats_lib
from mocheg_jax.data.mocheg import SPLITS, MochegRelease
from mocheg_jax.data.report import MochegInputError
from mocheg_jax.explanation import stage as explanation_stage
from mocheg_jax.parallel import distributed
from mocheg_jax.pipeline import fact_checker
from mocheg_jax.pipeline import manifest as manifest_lib
from mocheg_jax.pipeline import report as report_lib
from mocheg_jax.retrieval import stage as retrieval_stage
from mocheg_jax.utils import configs
from mocheg_jax.utils import paths
from mocheg_jax.utils import resident_memory
from mocheg_jax.verification import stage as verification_stage

# Small shapes for the one-batch smoke draw; the stage configs own the real ones.
DEMO_SHAPES = {
    "text_retrieval": dict(max_query_len=32, max_doc_len=48),
    "image_retrieval": dict(max_query_len=32, image_size=64),
    "verification": dict(max_claim_len=32, max_evidence_len=48, max_text_evidence=4,
                         max_images=2, image_size=64),
    "explanation": dict(max_source_len=128, max_target_len=96),
}
SAMPLE_CLAIMS = 3  # Test claims the main job fact-checks at the end.
# The stage configs the main job trains with (configs/NAME.py).
STAGE_CONFIGS = ("retrieval_text", "rerank", "captions", "retrieval_image", "verify",
                 "classifier", "explain")
# Fields a `paper` run cannot default (no hub downloads): the flag of scripts/run_pipeline.py
# that sets each.
PAPER_REQUIRED = {("retrieval_image", "model.init"): "--clip",
                  ("classifier", "classifier.init"): "--bert",
                  ("explain", "explain.init"): "--bart"}


def _describe(batch: dict[str, np.ndarray]) -> str:
  return ", ".join(f"{k} {v.dtype}{list(v.shape)}" for k, v in sorted(batch.items()))


def _sample_checks(workdir: str, release: MochegRelease, log: Callable[[str], None]
                   ) -> list[dict]:
  """The pipeline folder at work: a few test claims fact-checked, their JSON printed (what
  scripts/fact_check.py prints)."""
  claims = [c.claim for c in release.claims("test")[:SAMPLE_CLAIMS]]
  checker = fact_checker.FactChecker.load(workdir)
  try:
    results = [r.to_json() for r in checker.check_many(claims)]
  finally:
    checker.close()
  log(f"\nfact-checked {len(results)} test claims with the pipeline in {workdir} "
      f"(scripts/fact_check.py --pipeline={workdir} --claim=...):")
  for result in results:
    log(json.dumps(result, ensure_ascii=False))
  return results


def check_overrides(scale: str, workdir: str, seed: int,
                    overrides: configs.Overrides | None) -> None:
  """Fails before any work on an override of an unknown config or field, or when a `paper`
  stage config lacks a required local folder (smaller scales start from random weights)."""
  unknown = sorted(set(overrides or {}) - set(STAGE_CONFIGS))
  if unknown:
    raise MochegInputError(f"overrides name unknown configs {unknown}; the main job's are "
                           f"{list(STAGE_CONFIGS)}")
  built = {name: configs.stage_config(name, scale, workdir, seed, overrides=overrides)
           for name in STAGE_CONFIGS}
  if scale != "paper":
    return
  missing = [f"{flag} (configs/{name}.py field {key})"
             for (name, key), flag in PAPER_REQUIRED.items() if not _field(built[name], key)]
  if missing:
    raise MochegInputError(f"scale {scale!r} needs local model folders: "
                           + ", ".join(missing))


def _field(config, key: str):
  for part in key.split("."):
    config = config[part]
  return config


def run(scale: str, workdir: str, seed: int = 0, log: Callable[[str], None] = print, *,
        release: str = "", overrides: configs.Overrides | None = None) -> dict:
  """Runs the main job into `workdir`; returns the summary also written as summary.json.

  Args:
    release: a Mocheg release folder to run on; "" writes the synthetic world of `scale`
      into WORKDIR/release.
    overrides: config name -> {dotted key: value}, applied to that stage's
      configs/NAME.py:SCALE (e.g. the `paper` models' local folders).
  """
  # Absolute from here on: the stages save their paths in their configs, and only absolute
  # ones can be read from another directory or relocated when the folder moves.
  workdir = os.path.abspath(workdir)
  release = os.path.abspath(release) if release else ""
  os.makedirs(workdir, exist_ok=True)
  check_overrides(scale, workdir, seed, overrides)
  # A finished folder copied elsewhere and run again: what it recorded names the old root.
  moved = manifest_lib.recorded_move(workdir)
  if moved:
    log(f"{workdir} was written at {moved[0]}: the paths recorded there are read as "
        f"under {workdir}")
  with paths.moved_folder(moved):
    return _run(scale, workdir, seed, log, release, overrides, moved)


def _run(scale: str, workdir: str, seed: int, log: Callable[[str], None], release: str,
         overrides: configs.Overrides | None, moved: paths.Moved) -> dict:
  summary: dict = {"scale": scale, "seed": seed, "timings_s": {}, "peak_resident_gb": {},
                   "release": configs.release_dir(workdir, release),
                   "matmul_precision": jax.config.jax_default_matmul_precision or ""}
  stage_inputs = dict(release=release, overrides=overrides)

  def timed(name: str, fn: Callable[[], object]):
    start = time.perf_counter()
    with resident_memory.PeakWindow() as memory:
      out = fn()
    summary["timings_s"][name] = round(time.perf_counter() - start, 2)
    summary["peak_resident_gb"][name] = memory.peak_gb
    return out

  data = timed("prepare", lambda: distributed.primary_first(
      "prepare", lambda: prepare_lib.prepare(workdir, release=release or None, scale=scale,
                                             seed=seed, log=log)))
  release = MochegRelease(data.release)
  per_split = {s: stats_lib.split_stats(release.claims(s)) for s in SPLITS}
  kb = timed("kb_stats", lambda: stats_lib.kb_stats(release))
  log("\n" + stats_lib.release_table(per_split))
  log(stats_lib.kb_line(kb))
  log(f"reading the release: {release.report.summary()}")
  summary["splits"] = {s: vars(v) for s, v in per_split.items()}
  summary["kb"] = vars(kb)
  for name, p in data.prepared.items():
    sizes = ", ".join(f"{k}={v.num_examples:,}" for k, v in p.builder.info.splits.items())
    log(f"TFDS {name}: {sizes}" + (f"; {p.skipped}" if p.skipped else ""))

  summary["batches"] = {}
  loader = pipelines.LoaderConfig(batch_size=4, seed=seed, shard_index=0, shard_count=1)
  for task, make_pipeline in pipelines.TASKS.items():
    tokenizer = data.bpe if task == "explanation" else data.wordpiece
    pipeline = make_pipeline(data.tfds, "train", tokenizer, loader, **DEMO_SHAPES[task])
    batch = next(iter(pipeline))
    log(f"{task}: {pipeline.num_records} train records ({pipeline.skipped} skipped: "
        f"{pipeline.skip_reason}); batch {_describe(batch)}")
    summary["batches"][task] = {k: list(v.shape) for k, v in batch.items()}

  retrieval = timed("retrieval", lambda: retrieval_stage.run(
      workdir, scale, seed, log, **stage_inputs))
  summary["retrieval"] = retrieval["rows"]
  summary["retrieval_system_text"] = retrieval["system_text"]
  summary["retrieval_system_image"] = retrieval["system_image"]
  verification = timed("verification", lambda: verification_stage.run(
      workdir, scale, seed, log, **stage_inputs))
  summary["verification"] = verification["rows"]
  summary["system_labels"] = verification["system_labels"]
  explanation = timed("explanation", lambda: explanation_stage.run(
      workdir, scale, seed, log, **stage_inputs))
  summary["explanation"] = explanation["rows"]
  summary["explanation_classifier"] = explanation["classifier"]
  for key in ("timings_s", "peak_resident_gb"):  # Its trainings, as "explanation.NAME".
    summary[key].update({f"explanation.{k}": v for k, v in explanation[key].items()})

  def publish() -> dict:
    manifest_lib.write_manifest(
        workdir, scale=scale, seed=seed, release=summary["release"], moved=moved,
        settings=manifest_lib.Settings(
            rerank_weight=retrieval["system_text"]["weight"],
            image_articles=retrieval["system_image"]["articles"],
            matmul_precision=summary["matmul_precision"]),
        verifier=verification["system_labels"]["stage"])
    summary["fact_checks"] = timed("fact_check_samples", lambda: _sample_checks(
        workdir, release, log))
    report = report_lib.write_report(workdir, summary, log=log)
    log(f"report: {os.path.join(workdir, 'report.md')} ({len(report['plots'])} plots)")
    with open(os.path.join(workdir, "summary.json"), "w") as f:
      json.dump(summary, f, indent=2, default=list)
    return summary

  # Every process returns process 0's summary.
  return distributed.primary_only("publish", publish)
