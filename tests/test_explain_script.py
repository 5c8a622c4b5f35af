"""The explanation generator's inputs (gold or system labels x gold or system evidence, and
their bad-input rules) and scripts/explain.py on a tiny trained generator."""

from __future__ import annotations

import csv
import json
import pathlib
import subprocess

import jax
import numpy as np
import pytest

from mocheg_jax.data.labels import LABEL_NAMES
from mocheg_jax.data.mocheg import MochegRelease
from mocheg_jax.data.report import MochegInputError
from mocheg_jax.explanation import inputs as inputs_lib
from mocheg_jax.retrieval import results as results_lib
from mocheg_jax.train import loop
from mocheg_jax.utils.configs import load_config
from mocheg_jax.verification import predictions
from tests.processes import run_script

REPO = pathlib.Path(__file__).resolve().parents[1]


def _config(data_dir):
  """A 1-layer generator, 2 steps: only the plumbing is under test here."""
  config = load_config("explain", "tiny")
  config.data.dir = str(data_dir)
  config.mesh.data = 1
  config.total_steps, config.batch_size, config.log_every = 2, 4, 1
  config.eval_every, config.checkpoint_every = 0, 2
  config.optimizer.warmup_steps = 0
  e = config.explain
  e.d_model, e.layers, e.heads, e.ffn, e.max_positions = 16, 1, 2, 32, 64
  e.max_source_len, e.max_target_len = 48, 48
  e.sample_max_length, e.max_decode_length = 12, 12
  e.eval_batch_size, e.eval_max_claims = 4, 4
  return config


@pytest.fixture(scope="module")
def generator(tmp_path_factory):
  root = tmp_path_factory.mktemp("explain_script")
  result = loop.train(_config(root / "data"), str(root / "gen"), devices=jax.devices()[:1],
                      log=lambda _: None)
  assert result.status == "finished"
  return root, MochegRelease(root / "data" / "release")


def _system_csvs(release: MochegRelease, folder: pathlib.Path):
  """A prediction CSV for every test claim but the first (labels rotated by one class) and
  a result CSV whose second claim retrieved nothing."""
  claims = release.claims("test")
  labels_csv, evidence_csv = folder / "verify.csv", folder / "results.csv"
  probabilities = [np.eye(3)[(c.label + 1) % 3] for c in claims[1:]]
  predictions.write_predictions(str(labels_csv), [c.claim_id for c in claims[1:]],
                                probabilities)
  sentences = [s for _, s in zip(range(60), release.iter_sentences())]
  rows = [results_lib.RetrievedEvidence(
      c.claim_id, tuple(s.corpus_id for s in sentences[i:i + 3]),
      tuple(s.text for s in sentences[i:i + 3]), (3.0, 2.0, 1.0))
      if i != 1 else results_lib.RetrievedEvidence(c.claim_id)
      for i, c in enumerate(claims)]
  results_lib.write_results(evidence_csv, rows)
  return claims, labels_csv, evidence_csv, sentences


def test_inputs_from_gold_and_system_sources(generator, tmp_path):
  _, release = generator
  claims, labels_csv, evidence_csv, sentences = _system_csvs(release, tmp_path)
  gold = inputs_lib.build_inputs(release, "test")
  assert [c.claim_id for c in gold.claims] == [c.claim_id for c in claims]
  assert gold.intended_labels == gold.gold_labels == tuple(c.label for c in claims)
  assert [c.evidence for c in gold.claims] == [tuple(e.strip() for e in c.evidence if e.strip())
                                               for c in claims]
  assert gold.counts()["missing_label"] == 0

  system = inputs_lib.build_inputs(release, "test", labels=str(labels_csv),
                                   evidence=str(evidence_csv), top_text=2)
  # The claim without a prediction is skipped and counted; the others get the CSV's label.
  assert system.missing_label == 1 and system.split_claims == len(claims)
  assert [c.claim_id for c in system.claims] == [c.claim_id for c in claims[1:]]
  assert system.intended_labels == tuple((c.label + 1) % 3 for c in claims[1:])
  assert system.gold_labels == tuple(c.label for c in claims[1:])
  # Retrieved sentences, best first, top_text of them; claim 1 retrieved nothing.
  assert system.claims[0].evidence == ()
  assert system.claims[1].evidence == tuple(s.text for s in sentences[2:4])
  assert system.no_evidence == 1 and "1 skipped (no row in" in system.summary()


def _write(path, header, rows):
  with open(path, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(header)
    writer.writerows(rows)
  return str(path)


def test_bad_prediction_csvs_are_named_errors(generator, tmp_path):
  _, release = generator
  claim = release.claims("test")[0].claim_id
  header = list(predictions.COLUMNS)
  good = [claim, "NEI", "0.1", "0.2", "0.7"]
  cases = [
      (header[:-1], [good[:-1]], "header lacks column(s) p_nei"),
      (header, [[claim, "maybe", "0.1", "0.2", "0.7"]], "row 1, column label: unknown label "
       "'maybe'"),
      (header, [good, [claim, "NEI", "0.1", "0.2", "0.7"]], "row 2, column claim_id: claim "
       f"{claim} already appeared in row 1"),
      (header, [[claim, "NEI", "0.1", "x", "0.7"]], "row 1, column p_supported: 'x' is not a "
       "number"),
      (header, [[claim, "NEI", "0.1", "1.5", "0.7"]], "not a probability"),
      (header, [["c1", "NEI", "0.1", "0.2", "0.7"]], "column claim_id: 'c1' is not an integer"),
      (header, [good, [987654, "NEI", "0.1", "0.2", "0.7"]], "not test claims of"),
  ]
  for i, (head, rows, message) in enumerate(cases):
    path = _write(tmp_path / f"bad{i}.csv", head, rows)
    with pytest.raises(MochegInputError, match=None) as error:
      inputs_lib.build_inputs(release, "test", labels=path)
    assert message in str(error.value) and path in str(error.value), str(error.value)
  with pytest.raises(MochegInputError, match="missing verification prediction file"):
    inputs_lib.build_inputs(release, "test", labels=str(tmp_path / "none.csv"))
  # A result CSV must cover the split (as for verification).
  results_lib.write_results(tmp_path / "partial.csv", [results_lib.RetrievedEvidence(claim)])
  with pytest.raises(MochegInputError, match="claims have no row"):
    inputs_lib.build_inputs(release, "test", evidence=str(tmp_path / "partial.csv"))


def test_count_truncated(generator):
  root, release = generator
  from mocheg_jax.data.tokenizers import load_tokenizer
  tokenizer = load_tokenizer(str(root / "data" / "tokenizers" / "bpe"))
  claims = inputs_lib.build_inputs(release, "test").claims
  lengths = [len(tokenizer(f"{LABEL_NAMES[c.label]} {c.claim} {' '.join(c.evidence)}")
                 ["input_ids"]) for c in claims]
  assert inputs_lib.count_truncated(tokenizer, claims, 10_000) == 0
  cut = inputs_lib.count_truncated(tokenizer, claims, int(np.median(lengths)))
  assert 0 < cut < len(claims)


def _script(*args: str) -> subprocess.CompletedProcess:
  return run_script(REPO / "scripts" / "explain.py", *args, timeout_s=600)  # One CPU device.


def _read(path):
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def test_explain_script_gold_and_system(generator, tmp_path):
  root, release = generator
  claims, labels_csv, evidence_csv, _ = _system_csvs(release, tmp_path)
  checkpoint = f"--checkpoint={root / 'gen'}"
  out = tmp_path / "gold.csv"
  proc = _script(checkpoint, "--split=test", f"--out={out}")  # The training release.
  assert proc.returncode == 0, proc.stderr
  report = json.loads(proc.stdout.strip().splitlines()[-1])
  rows = _read(out)
  assert [int(r["claim_id"]) for r in rows] == [c.claim_id for c in claims]
  assert list(rows[0]) == ["claim_id", "explanation"]
  assert report["written"] == report["split_claims"] == len(claims)
  assert 0 <= report["rougeL"] <= 1 and report["missing_label"] == 0

  out = tmp_path / "system.csv"
  proc = _script(checkpoint, f"--release={root / 'data' / 'release'}", "--split=test",
                 f"--labels={labels_csv}", f"--evidence={evidence_csv}", f"--out={out}",
                 "--batch_size=3")
  assert proc.returncode == 0, proc.stderr
  report = json.loads(proc.stdout.strip().splitlines()[-1])
  assert [int(r["claim_id"]) for r in _read(out)] == [c.claim_id for c in claims[1:]]
  assert (report["missing_label"], report["no_evidence"]) == (1, 1)

  # Bad input ends in one line and exit 1, before any model is loaded.
  bad = _write(tmp_path / "bad.csv", predictions.COLUMNS,
               [[claims[0].claim_id, "probably", "0.1", "0.2", "0.7"]])
  proc = _script(checkpoint, f"--release={root / 'data' / 'release'}", f"--labels={bad}",
                 f"--out={tmp_path / 'x.csv'}")
  assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
  assert f"{bad}: row 1, column label: unknown label 'probably'" in proc.stderr
  assert not (tmp_path / "x.csv").exists()
