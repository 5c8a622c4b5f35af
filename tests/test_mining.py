"""Mined hard negatives: the per-workdir cache, and the text retriever's BM25 mining."""

from __future__ import annotations

import csv
import json
import os

import pytest

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.retrieval import mining
from mocheg_jax.retrieval import text_task
from mocheg_jax.utils import paths
from tests.release_fixture import write_release


def test_mining_cache_runs_once_and_rejects_other_settings(tmp_path):
  path = str(tmp_path / mining.MINED_FILE)
  calls = []

  def make():
    calls.append(1)
    return {"train": {"7": ["s5"]}, "dev": {"3": [["s1", 2.0]]}, "retriever_step": None}

  quiet = lambda _: None  # noqa: E731
  settings = {"method": "bm25", "mine_top_k": 30}
  first = mining.cached_mining(path, settings, make, log=quiet)
  again = mining.cached_mining(path, settings, make, log=quiet)
  assert len(calls) == 1 and first == again and first["train"] == {"7": ["s5"]}
  with pytest.raises(MochegInputError, match="mine_top_k"):
    mining.cached_mining(path, {**settings, "mine_top_k": 50}, make, log=quiet)
  # A cache that names its retriever under a folder since moved: the same retriever there.
  moved_path = str(tmp_path / "moved.json")
  old = {**settings, "retriever": "/cluster/run/stages/retrieval_text"}
  mining.cached_mining(moved_path, old, make, log=quiet)
  now = {**settings, "retriever": "/home/run/stages/retrieval_text"}
  with pytest.raises(MochegInputError, match="retriever differ"):
    mining.cached_mining(moved_path, now, make, log=quiet)
  with paths.moved_folder(("/cluster/run", "/home/run")):
    assert mining.cached_mining(moved_path, now, make, log=quiet)["settings"] == old
  assert len(calls) == 2
  with open(path, "w") as f:
    f.write("{not json")
  with pytest.raises(MochegInputError, match="unreadable"):
    mining.cached_mining(path, settings, make, log=quiet)


def test_bm25_negatives_skip_relevant_sentences_and_their_repeats(tmp_path):
  root = str(tmp_path / "release")
  write_release(root)
  # Another article repeats claim 1's relevant "It has three arches.": no negative of it.
  # And a restatement of claim 1.
  with open(os.path.join(root, "supplementary", "Corpus3_sentence_level.csv"), "a",
            newline="") as f:
    csv.writer(f, lineterminator="\n").writerows([
        [2, 8, 2, "2-8-2", "It has three arches."],
        [2, 8, 3, "2-8-3", "The bridge has 3 arches, a post claimed."]])
  mined = text_task.mine_bm25_negatives(root, top_k=5, log=lambda _: None)
  # Train claims with a relevant sentence only (claim 4 has none); best BM25 hit first:
  # the restatement shares all of claim 1's words. Claim 2's judged-irrelevant sentence
  # (relevancy 0) is a negative like any other.
  assert mined == {"1": ["The bridge has 3 arches, a post claimed.", "A photo of a bridge."],
                   "2": ["It is not Varlen.", "The bridge has 3 arches, a post claimed."]}
  assert text_task.mine_bm25_negatives(root, top_k=1, log=lambda _: None)["1"] == [
      "The bridge has 3 arches, a post claimed."]


def test_text_retriever_trains_on_mined_negatives_cached_in_its_workdir(tmp_path):
  from configs import retrieval_text as text_configs
  from mocheg_jax.data import prepare

  data_dir = str(tmp_path / "data")
  prepare.prepare(data_dir, scale="tiny", log=lambda _: None)
  config = text_configs.get_config("tiny")
  config.data.dir = data_dir
  config.retrieval.mined_negatives = "bm25"
  config.retrieval.mine_top_k = 3
  workdir = str(tmp_path / "text")
  task = text_task.make_task(config, workdir)
  batch = next(iter(task.train_data(4)))
  assert batch["has_negative"].all()
  with open(os.path.join(workdir, mining.MINED_FILE)) as f:
    cached = json.load(f)
  assert cached["settings"] == {"method": "bm25", "mine_top_k": 3, "data": "synthetic/tiny"}
  expected = text_task.mine_bm25_negatives(os.path.join(data_dir, "release"), 3,
                                           log=lambda _: None)
  assert cached["train"] == expected and all(len(v) == 3 for v in expected.values())
  config.retrieval.mine_top_k = 4  # The same workdir with other settings: an error.
  with pytest.raises(MochegInputError, match="mine_top_k"):
    text_task.make_task(config, workdir).train_data(4)
  config.retrieval.mined_negatives = "dense"
  with pytest.raises(ValueError, match="mined_negatives 'dense'"):
    text_task.make_task(config, str(tmp_path / "other")).train_data(4)
