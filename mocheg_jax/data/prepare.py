"""A release made ready for the pipelines: tokenizers trained on it and its TFDS datasets.

Every stage's task starts here. Without a release folder, the synthetic world of the given
scale is written first, so a `tiny` config trains on a fresh machine with no set-up. Each
step is done once per folder: a rerun reuses what an earlier one finished.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Callable

from mocheg_jax.data import tfds_mocheg
from mocheg_jax.data import tokenizers
from mocheg_jax.data.mocheg import SPLITS, MochegRelease
from mocheg_jax.data.synthetic import write_world

DONE_MARKER = ".complete"
# Which synthetic world a release folder holds ({"scale", "seed"}), so that a run asking for
# another one is stopped instead of silently reading this one.
WORLD_RECORD = ".world.json"


@dataclasses.dataclass(frozen=True)
class PreparedData:
  release: str  # The release folder (Mocheg layout).
  tfds: str  # TFDS data_dir with the `mocheg` datasets.
  wordpiece: str  # BERT-style tokenizer trained on the release (for randomly initialised models).
  bpe: str  # Byte-level BPE tokenizer (BART-style).
  prepared: dict  # {config name: tfds_mocheg.Prepared} (skip counts per dataset).


def once(path: str, make: Callable[[str], None]) -> bool:
  """Runs `make(path)` unless an earlier run finished it; a half-made `path` is redone."""
  if os.path.exists(os.path.join(path, DONE_MARKER)):
    return False
  shutil.rmtree(path, ignore_errors=True)
  make(path)
  open(os.path.join(path, DONE_MARKER), "w").close()
  return True


def _write_recorded_world(release: str, scale: str, seed: int) -> None:
  write_world(release, scale=scale, seed=seed, progress=True)
  with open(os.path.join(release, WORLD_RECORD), "w") as f:
    json.dump({"scale": scale, "seed": seed}, f)


def _check_world_record(release: str, scale: str, seed: int) -> None:
  """Raises if `release` holds another synthetic world than (scale, seed).

  Folders made before the record existed carry none and are reused as they are.
  """
  path = os.path.join(release, WORLD_RECORD)
  if not os.path.exists(path):
    return
  with open(path) as f:
    held = json.load(f)
  if (held.get("scale"), held.get("seed")) != (scale, seed):
    raise ValueError(
        f"{release} holds the synthetic world (scale {held.get('scale')!r}, seed "
        f"{held.get('seed')!r}) but this run asks for (scale {scale!r}, seed {seed}): give "
        f"another data.dir, or data.world_seed={held.get('seed')} to train on the one there")


def corpus_texts(release: MochegRelease):
  """Every text of the release (claims, explanations, evidence, KB sentences)."""
  for split in SPLITS:
    for c in release.claims(split):
      yield c.claim
      yield c.explanation
      yield from c.evidence
  for s in release.iter_sentences():
    yield s.text


def prepare(out_dir: str, *, release: str | None = None, scale: str = "tiny", seed: int = 0,
            log: Callable[[str], None] = print) -> PreparedData:
  """Prepares `release` (or a synthetic world of `scale`) under `out_dir`."""
  os.makedirs(out_dir, exist_ok=True)
  if not release:
    release = os.path.join(out_dir, "release")
    made = once(release, lambda p: _write_recorded_world(p, scale, seed))
    if not made:
      _check_world_record(release, scale, seed)
    log(f"synthetic world ({scale}, seed {seed}) {'written to' if made else 'reused from'} "
        f"{release}")
  elif not os.path.isdir(release):
    raise NotADirectoryError(f"data.release {release!r} is not a folder")
  reader = MochegRelease(release)
  tok_dir = os.path.join(out_dir, "tokenizers")
  wordpiece, bpe = os.path.join(tok_dir, "wordpiece"), os.path.join(tok_dir, "bpe")
  once(wordpiece, lambda p: tokenizers.train_wordpiece(corpus_texts(reader), p))
  once(bpe, lambda p: tokenizers.train_byte_bpe(corpus_texts(reader), p))
  data_dir = os.path.join(out_dir, "tfds")
  prepared = tfds_mocheg.build(release, data_dir)
  return PreparedData(release, data_dir, wordpiece, bpe, prepared)
