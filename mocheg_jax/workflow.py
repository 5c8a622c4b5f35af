"""The main job: synthetic world -> statistics -> tokenizers -> TFDS -> a batch per task.

Later stages (training, indexing, verification, explanation, report) extend `run`; each
step reuses what an earlier run of the same workdir already finished.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import Callable

import numpy as np

from mocheg_jax.data import pipelines
from mocheg_jax.data import stats as stats_lib
from mocheg_jax.data import tfds_mocheg
from mocheg_jax.data import tokenizers
from mocheg_jax.data.mocheg import SPLITS, MochegRelease
from mocheg_jax.data.synthetic import write_world

DONE_MARKER = ".complete"

# Small shapes for the one-batch smoke draw; the stage configs own the real ones.
DEMO_SHAPES = {
    "text_retrieval": dict(max_query_len=32, max_doc_len=48),
    "image_retrieval": dict(max_query_len=32, image_size=64),
    "verification": dict(max_claim_len=32, max_evidence_len=48, max_text_evidence=4,
                         max_images=2, image_size=64),
    "explanation": dict(max_source_len=128, max_target_len=96),
}


def _once(path: str, make: Callable[[str], None]) -> bool:
  """Runs `make(path)` unless an earlier run finished it; a half-made `path` is redone."""
  if os.path.exists(os.path.join(path, DONE_MARKER)):
    return False
  shutil.rmtree(path, ignore_errors=True)
  make(path)
  open(os.path.join(path, DONE_MARKER), "w").close()
  return True


def _corpus_texts(release: MochegRelease):
  for split in SPLITS:
    for c in release.claims(split):
      yield c.claim
      yield c.explanation
      yield from c.evidence
  for s in release.iter_sentences():
    yield s.text


def _describe(batch: dict[str, np.ndarray]) -> str:
  return ", ".join(f"{k} {v.dtype}{list(v.shape)}" for k, v in sorted(batch.items()))


def run(scale: str, workdir: str, seed: int = 0, log: Callable[[str], None] = print) -> dict:
  """Runs the main job into `workdir`; returns the summary also written as summary.json."""
  os.makedirs(workdir, exist_ok=True)
  summary: dict = {"scale": scale, "seed": seed, "timings_s": {}}

  def timed(name: str, fn: Callable[[], object]):
    start = time.perf_counter()
    out = fn()
    summary["timings_s"][name] = round(time.perf_counter() - start, 2)
    return out

  release_dir = os.path.join(workdir, "release")
  made = timed("world", lambda: _once(
      release_dir, lambda p: write_world(p, scale=scale, seed=seed, progress=True)))
  log(f"synthetic world ({scale}, seed {seed}) {'written to' if made else 'reused from'} "
      f"{release_dir}")

  release = MochegRelease(release_dir)
  per_split = {s: stats_lib.split_stats(release.claims(s)) for s in SPLITS}
  kb = timed("kb_stats", lambda: stats_lib.kb_stats(release))
  log("\n" + stats_lib.release_table(per_split))
  log(stats_lib.kb_line(kb))
  log(f"reading the release: {release.report.summary()}")
  summary["splits"] = {s: vars(v) for s, v in per_split.items()}
  summary["kb"] = vars(kb)

  tok_dir = os.path.join(workdir, "tokenizers")
  wordpiece, bpe = os.path.join(tok_dir, "wordpiece"), os.path.join(tok_dir, "bpe")
  timed("tokenizers", lambda: (
      _once(wordpiece, lambda p: tokenizers.train_wordpiece(_corpus_texts(release), p)),
      _once(bpe, lambda p: tokenizers.train_byte_bpe(_corpus_texts(release), p))))

  data_dir = os.path.join(workdir, "tfds")
  prepared = timed("tfds", lambda: tfds_mocheg.build(release_dir, data_dir))
  for name, p in prepared.items():
    sizes = ", ".join(f"{k}={v.num_examples:,}" for k, v in p.builder.info.splits.items())
    log(f"TFDS {name}: {sizes}" + (f"; {p.skipped}" if p.skipped else ""))

  summary["batches"] = {}
  loader = pipelines.LoaderConfig(batch_size=4, seed=seed, shard_index=0, shard_count=1)
  for task, make_pipeline in pipelines.TASKS.items():
    tokenizer = bpe if task == "explanation" else wordpiece
    pipeline = make_pipeline(data_dir, "train", tokenizer, loader, **DEMO_SHAPES[task])
    batch = next(iter(pipeline))
    log(f"{task}: {pipeline.num_records} train records ({pipeline.skipped} skipped: "
        f"{pipeline.skip_reason}); batch {_describe(batch)}")
    summary["batches"][task] = {k: list(v.shape) for k, v in batch.items()}

  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2, default=list)
  return summary
