"""Table 3 rows on hand-made runs with every figure computed by hand, the markdown table,
and scripts/evaluate_retrieval.py end to end on the tiny synthetic world."""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from mocheg_jax.data.synthetic import write_world
from mocheg_jax.metrics import trec
from mocheg_jax.retrieval import results as results_lib
from mocheg_jax.retrieval import table3

REPO = pathlib.Path(__file__).resolve().parents[1]
PYTHON = REPO / ".venv" / "bin" / "python"

# Claim 1: |R| = 3 (more than K=2, fewer than K=4), hits at ranks 0, 2 and 4.
# Claim 2: |R| = 1, hit at rank 1.  Claim 3: relevant items but absent from the run (0).
# Claim 4: judged, nothing relevant, in the run: skipped.  Claim 5: no qrels at all: skipped.
QRELS = {"1": {"a": 1, "b": 1, "c": 1, "z": 0}, "2": {"p": 1}, "3": {"m": 1, "n": 1},
         "4": {"z": 0}}
RUN = {"1": [("a", 9.0), ("x", 8.0), ("b", 7.0), ("y", 6.0), ("c", 5.0)],
       "2": [("q", 2.0), ("p", 1.0)], "4": [("z", 1.0)]}
CLAIMS = ["1", "2", "3", "4", "5"]
L2, L3, L6 = 1.0, 1 / math.log2(3), 1 / math.log2(6)  # gains 1/log2(r+2) at ranks 0, 1, 4

# Per claim by hand, then averaged over the 3 scored claims (claim 3 counts as 0).
EXPECTED = {
    2: dict(recall=(1 / 3 + 1) / 3, precision=(1 / 2 + 1 / 2) / 3,
            ndcg_at_k=(1 / (1 + L3) + L3) / 3, map_at_k=(1 / 2 + 1 / 2) / 3),
    4: dict(recall=(2 / 3 + 1) / 3, precision=(2 / 4 + 1 / 4) / 3,
            ndcg_at_k=((1 + 1 / 2) / (1 + L3 + 1 / 2) + L3) / 3,
            map_at_k=((1 + 2 / 3) / 3 + 1 / 2) / 3),
}
# Un-cut: claim 1 AP = (1/1 + 2/3 + 3/5) / 3; NDCG = (1 + 1/2 + 1/log2 6) / (1 + 1/log2 3 + 1/2).
MAP = ((1 + 2 / 3 + 3 / 5) / 3 + 1 / 2) / 3
NDCG = ((1 + 1 / 2 + L6) / (1 + L3 + 1 / 2) + L3) / 3

# S-Recall: 2-d embeddings chosen so that every cosine is a short decimal.
SENTENCES = {d: f"sentence {d.upper()}" for d in "abcpqxymnz"}
VECTORS = {"A": (1, 0), "B": (0, 1), "C": (0.6, 0.8), "X": (0.8, 0.6), "Y": (-1, 0),
           "P": (0, 1), "Q": (0.6, 0.8), "M": (1, 0), "N": (0, 1), "Z": (1, 1)}


class FakeEncoder:
  """Encodes 'sentence X' as VECTORS['X'] (times 3: normalising is the metric's job)."""

  def __init__(self):
    self.seen: list[str] = []

  def __call__(self, texts):
    self.seen += texts
    return 3.0 * np.array([VECTORS[t.removeprefix("sentence ")] for t in texts], float)


def test_rows_by_hand():
  encoder = FakeEncoder()
  rows = table3.table3_rows("Sys", {"text": RUN}, {"text": QRELS}, ks=(2, 4),
                            semantic={"text": encoder}, texts={"text": SENTENCES},
                            claim_ids=CLAIMS)
  assert [(r["system"], r["modality"], r["k"]) for r in rows] == [("Sys", "text", 2),
                                                                  ("Sys", "text", 4)]
  for row in rows:
    for key, value in EXPECTED[row["k"]].items():
      assert row[key] == pytest.approx(value, abs=1e-12), (row["k"], key)
    assert row["map"] == pytest.approx(MAP, abs=1e-12)
    assert row["ndcg"] == pytest.approx(NDCG, abs=1e-12)
    assert (row["num_scored"], row["num_missing"], row["num_no_qrels"]) == (3, 1, 2)
    assert row["num_semantic_skipped"] == 1  # claim 3: nothing retrieved
  # K=2. Claim 1: retrieved A X vs gold A B C: recall (1 + .6 + .96)/3, precision (1 + .96)/2.
  # Claim 2: retrieved Q P vs gold P: recall 1, precision (.8 + 1)/2.
  assert rows[0]["s_recall"] == pytest.approx((2.56 / 3 + 1) / 2)
  assert rows[0]["s_precision"] == pytest.approx((0.98 + 0.9) / 2)
  # K=4. Claim 1: retrieved A X B Y: recall (1 + 1 + .96)/3, precision (1 + .96 + 1 + 0)/4.
  assert rows[1]["s_recall"] == pytest.approx((2.96 / 3 + 1) / 2)
  assert rows[1]["s_precision"] == pytest.approx((0.74 + 0.9) / 2)
  # The encoder saw texts, each once across both K (the cache), never the ids.
  assert sorted(encoder.seen) == sorted(set(encoder.seen))
  assert set(encoder.seen) == {SENTENCES[d] for d in "abcxypq"}


def test_without_claim_list_and_images():
  """Images: the encoder gets the file names themselves; the claims are run + qrels."""
  names = {"a": "00001-00001-00-a.jpg", "p": "00002-00001-00-p.jpg"}
  qrels = {"1": {names["a"]: 1}, "2": {names["p"]: 1}, "9": {"zz.jpg": 0}}
  run = {"1": [(names["p"], 0.9), (names["a"], 0.8)], "2": [], "8": [(names["a"], 0.1)]}
  vectors = {names["a"]: (1.0, 0.0), names["p"]: (0.0, 1.0)}
  rows = table3.table3_rows("CLIP", {"image": run}, {"image": qrels}, ks=(1, 2),
                            semantic={"image": lambda n: np.array([vectors[x] for x in n])})
  one, two = rows
  assert (one["recall"], one["precision"], two["recall"], two["precision"]) == (0, 0, .5, .25)
  assert one["num_no_qrels"] == 2 and one["num_missing"] == 0  # claims 8 and 9
  assert one["s_recall"] == 0.0 and two["s_recall"] == 1.0 and two["s_precision"] == 0.5
  assert one["num_semantic_skipped"] == 1  # claim 2 retrieved nothing


def test_bad_input():
  with pytest.raises(ValueError, match=r"text run names 1 claim id\(s\) that are not claims "
                                       r"of the split, e.g. 4"):
    table3.table3_rows("S", {"text": RUN}, {"text": QRELS}, claim_ids=["1", "2", "3"])
  with pytest.raises(ValueError, match="text qrels names 1 claim id"):
    table3.table3_rows("S", {"text": {}}, {"text": QRELS}, claim_ids=["1", "2", "4"])
  with pytest.raises(ValueError, match="no claim has a relevant qrel"):
    table3.table3_rows("S", {"text": RUN}, {"text": {"4": {"z": 0}}})
  with pytest.raises(ValueError, match="no qrels for the image run"):
    table3.table3_rows("S", {"image": RUN}, {"text": QRELS})
  with pytest.raises(ValueError, match="claim 1: retrieved item 'x' has no text"):
    table3.table3_rows("S", {"text": RUN}, {"text": QRELS}, semantic={"text": FakeEncoder()},
                       texts={"text": {"a": "sentence A"}})


def test_format_table():
  rows = [
      dict(system="BM25", modality="text", k=5, recall=0.1972, precision=0.14921,
           ndcg_at_k=0.5, map_at_k=0.0, ndcg=1.0, map=0.123456, s_recall=None,
           s_precision=None, num_scored=2442),
      dict(system="CLIP", modality="image", k=10, recall=0.2144, precision=0.0302,
           ndcg_at_k=0.15324, map_at_k=0.1, ndcg=0.2, map=0.3, s_recall=0.71845,
           s_precision=0.5, num_scored=900),
  ]
  assert table3.format_table(rows) == (
      "| System | Modality | K | Rec@K | Pre@K | NDCG@K | MAP@K | NDCG | MAP | S-Rec@K | "
      "S-Pre@K | Scored |\n"
      "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
      "| BM25 | text | 5 | 19.72 | 14.92 | 50.00 | 0.00 | 100.00 | 12.35 | - | - | 2442 |\n"
      "| CLIP | image | 10 | 21.44 | 3.02 | 15.32 | 10.00 | 20.00 | 30.00 | 71.84 | 50.00 "
      "| 900 |")


# ---- scripts/evaluate_retrieval.py ---------------------------------------------------------
def _script(*args: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
  python = str(PYTHON) if PYTHON.exists() else sys.executable
  return subprocess.run([python, "scripts/evaluate_retrieval.py", *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  root = tmp_path_factory.mktemp("world")
  write_world(root, "tiny", seed=0, workers=0, progress=False)
  return root


def _table_rows(stdout: str) -> list[list[str]]:
  lines = [l for l in stdout.splitlines() if l.startswith("|")]
  assert lines[0].startswith("| System | Modality | K | Rec@K"), stdout
  return [[c.strip() for c in l.strip("|").split("|")] for l in lines[2:]]


def test_script_bm25_end_to_end(world, tmp_path):
  out, run, res = tmp_path / "rows.json", tmp_path / "bm25.run", tmp_path / "res.csv"
  proc = _script(f"--release={world}", "--split=test", "--bm25", f"--out={out}",
                 f"--write_run={run}", f"--write_results={res}")
  assert proc.returncode == 0, proc.stderr
  table = _table_rows(proc.stdout)
  assert [r[:3] for r in table] == [["BM25", "text", "5"], ["BM25", "text", "10"]]
  assert float(table[0][3]) > 5.0  # Rec@5 in percent: BM25 finds some of the evidence
  rows = json.loads(out.read_text())
  assert rows[0]["recall"] > 0.05 and rows[0]["num_no_qrels"] >= 1
  assert "claims without relevant qrels skipped" in proc.stderr

  # The written run scores the same as a system run, and matches the result CSV.
  bm25_run = trec.read_run(run)
  assert all(len(ranked) <= 100 for ranked in bm25_run.values())
  results = results_lib.read_results(res)
  first = next(iter(results.values()))
  assert list(first.text_ids) == [d for d, _ in bm25_run[str(first.claim_id)][:10]]
  again = _script(f"--release={world}", f"--text_run={run}", "--system=BM25", "--k=5,10")
  assert again.returncode == 0, again.stderr
  assert _table_rows(again.stdout) == table

  # A perfect image run from the image qrels: every recall is 1 where |R| <= K.
  qrels = trec.read_qrels(world / "test" / "img_evidence_qrels.csv")
  perfect = {t: [(d, 1.0 / (i + 1)) for i, d in enumerate(sorted(docs))]
             for t, docs in qrels.items()}
  image_run = tmp_path / "image.run"
  trec.write_run(image_run, perfect, tag="oracle")
  proc = _script(f"--release={world}", f"--image_run={image_run}", "--system=Oracle",
                 "--k=1,10")
  assert proc.returncode == 0, proc.stderr
  table = _table_rows(proc.stdout)
  assert table[1][:4] == ["Oracle", "image", "10", "100.00"] and table[1][5] == "100.00"


def test_script_bad_input(world, tmp_path):
  run = tmp_path / "run.txt"
  run.write_text("27 Q0 1-1-0 1 2.0 t\n27 Q0 9999-1-0 2 1.0 t\n")
  proc = _script(f"--release={world}", f"--text_run={run}")
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  assert f"{run}: 1 retrieved sentences are not in the release's KB, e.g. 9999-1-0" \
      in proc.stderr
  run.write_text("123456 Q0 1-1-0 1 2.0 t\n")
  proc = _script(f"--release={world}", f"--text_run={run}")
  assert proc.returncode == 1 and "not claims of the split, e.g. 123456" in proc.stderr
  proc = _script(f"--release={tmp_path / 'nowhere'}", "--bm25")
  assert proc.returncode == 1 and "release folder does not exist" in proc.stderr
  proc = _script(f"--release={world}")
  assert proc.returncode == 1 and "nothing to score" in proc.stderr
  proc = _script(f"--release={world}", "--bm25", "--k=0")
  assert proc.returncode == 1 and "--k must be positive integers" in proc.stderr


@pytest.mark.slow
def test_script_semantic_recall_with_encoders(world, tmp_path):
  """--encoder (text) and --image_encoder (CLIP, from the image files) on tiny random models:
  an oracle image run retrieves every gold image, so its S-Rec@10 is exactly 100."""
  import torch
  import transformers
  from mocheg_jax.data.tokenizers import train_wordpiece
  corpus = [line for line in (world / "Corpus3.csv").read_text().splitlines()[:300]]
  bert_dir, clip_dir = tmp_path / "bert", tmp_path / "clip"
  tokenizer = train_wordpiece(corpus, bert_dir, vocab_size=200)
  train_wordpiece(corpus, clip_dir, vocab_size=200)
  torch.manual_seed(0)
  transformers.BertModel(transformers.BertConfig(
      vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
      intermediate_size=37, max_position_embeddings=64)).save_pretrained(bert_dir)
  specials = dict(eos_token_id=tokenizer.sep_token_id, bos_token_id=tokenizer.cls_token_id,
                  pad_token_id=tokenizer.pad_token_id)
  transformers.CLIPModel(transformers.CLIPConfig(
      text_config=dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=37,
                       num_attention_heads=4, num_hidden_layers=1,
                       max_position_embeddings=16, **specials),
      vision_config=dict(hidden_size=32, intermediate_size=37, num_attention_heads=4,
                         num_hidden_layers=1, image_size=32, patch_size=8),
      projection_dim=16)).save_pretrained(clip_dir)
  qrels = trec.read_qrels(world / "test" / "img_evidence_qrels.csv")
  image_run = tmp_path / "image.run"
  trec.write_run(image_run, {t: [(d, 1.0) for d in sorted(docs)] for t, docs in qrels.items()},
                 tag="oracle")
  out = tmp_path / "rows.json"
  proc = _script(f"--release={world}", "--bm25", f"--image_run={image_run}",
                 f"--encoder={bert_dir}", f"--image_encoder={clip_dir}", "--k=10",
                 f"--out={out}")
  assert proc.returncode == 0, proc.stderr
  text, image = json.loads(out.read_text())
  assert (text["modality"], image["modality"]) == ("text", "image")
  assert 0 < text["s_recall"] <= 1 and 0 < text["s_precision"] <= 1
  assert image["recall"] == 1.0 and image["s_recall"] == pytest.approx(1.0, abs=1e-6)
  assert image["num_semantic_skipped"] == 0
