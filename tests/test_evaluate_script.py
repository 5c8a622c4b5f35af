"""scripts/evaluate.py end to end, run as a user runs it (a subprocess from the repo root)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PYTHON = REPO / ".venv" / "bin" / "python"


def _run(*args: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
  python = str(PYTHON) if PYTHON.exists() else sys.executable
  return subprocess.run([python, "scripts/evaluate.py", *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=120)


def _ok(*args: str) -> dict:
  proc = _run(*args)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.strip().splitlines()
  assert len(lines) == 1, proc.stdout  # One JSON object on stdout, nothing else.
  return json.loads(lines[0])


def test_retrieval(tmp_path):
  qrels = tmp_path / "qrels.csv"
  qrels.write_text("TOPIC,ITERATION,DOCUMENT#,RELEVANCY\n"
                   "1,0,1-5-0,1\n1,0,1-5-3,1\n2,0,2-9-1,1\n3,0,3-1-1,0\n")
  run = tmp_path / "run.txt"
  run.write_text("1 Q0 1-5-3 1 9.0 t\n1 Q0 1-5-9 2 8.0 t\n1 Q0 1-5-0 3 7.0 t\n"
                 "2 Q0 2-9-0 1 5.0 t\n")
  got = _ok("--task=retrieval", f"--qrels={qrels}", f"--run={run}", "--k=1,3")
  assert got["num_queries"] == 2 and got["num_missing"] == 0
  assert got["P@1"] == pytest.approx(0.5)
  assert got["R@3"] == pytest.approx(0.5)
  assert got["MAP@3"] == pytest.approx((1 + 2 / 3) / 2 / 2)
  assert got["MRR@10"] == pytest.approx(0.5)
  for key in ("P@3", "R@1", "NDCG@1", "NDCG@3", "MAP@1", "map", "ndcg"):
    assert 0 <= got[key] <= 1, key
  default_ks = _ok("--task=retrieval", f"--qrels={qrels}", f"--run={run}")
  assert {"P@5", "R@5", "NDCG@5", "MAP@5", "P@10", "MAP@10", "map", "ndcg", "MRR@10"} <= set(
      default_ks)


def test_verification(tmp_path):
  gold = tmp_path / "gold.csv"
  gold.write_text("claim_id,label\n1,refuted\n2,supported\n3,NEI\n4,NEI\n")
  pred = tmp_path / "pred.csv"
  pred.write_text("claim_id,label,p_refuted,p_supported,p_nei\n"
                  "1,0,0.8,0.1,0.1\n2,supported,0.1,0.8,0.1\n3,nei,0.1,0.1,0.8\n")
  got = _ok("--task=verification", f"--gold={gold}", f"--pred={pred}", "--allow_missing")
  assert got["accuracy"] == pytest.approx(0.75)
  assert got["num_unpredicted"] == 1
  assert got["f1/refuted"] == pytest.approx(1.0)
  assert got["recall/NEI"] == pytest.approx(0.5)
  assert got["confusion_matrix"] == [[1, 0, 0], [0, 1, 0], [0, 0, 1]]
  assert {"micro_f1", "macro_f1"} <= set(got)
  proc = _run("--task=verification", f"--gold={gold}", f"--pred={pred}")
  assert proc.returncode == 1
  assert "1 of 4 claims" in proc.stderr and "claim_id 4" in proc.stderr


def test_generation(tmp_path):
  refs = tmp_path / "refs.csv"
  refs.write_text('claim_id,explanation\n1,"The photo was edited. It is fake."\n'
                  "2,Officials confirmed the claim.\n")
  preds = tmp_path / "preds.csv"
  preds.write_text('claim_id,explanation\n1,"The photo was edited. It is fake."\n'
                   "2,The claim is not confirmed by officials.\n")
  got = _ok("--task=generation", f"--refs={refs}", f"--preds={preds}")
  for key in ("rouge1", "rouge2", "rougeL", "rougeLsum", "bleu"):
    assert 0 < got[key] < 1, key
  assert got["rouge1"] > got["rouge2"]
  assert got["num_pairs"] == 2


@pytest.mark.parametrize("make_args,message", [
    (lambda d: ["--task=retrieval", f"--qrels={d / 'missing.csv'}", f"--run={d / 'run.txt'}"],
     "missing file"),
    (lambda d: ["--task=verification", f"--gold={d / 'dup.csv'}", f"--pred={d / 'dup.csv'}"],
     "row 2: duplicate claim_id '7'"),
    (lambda d: ["--task=retrieval", f"--qrels={d / 'run.txt'}", f"--run={d / 'run.txt'}"],
     "unrecognised qrels format"),
    (lambda d: ["--task=generation", f"--refs={d / 'dup.csv'}"], "needs --preds"),
    (lambda d: ["--task=retrieval", f"--qrels={d / 'run.txt'}", f"--run={d / 'run.txt'}",
                "--k=0"], "--k must be positive"),
])
def test_bad_input_is_one_line_and_exit_1(tmp_path, make_args, message):
  (tmp_path / "run.txt").write_text("1 Q0 a 1 1.0 t\n")
  (tmp_path / "dup.csv").write_text("claim_id,label\n7,NEI\n7,refuted\n")
  proc = _run(*make_args(tmp_path))
  assert proc.returncode == 1
  assert proc.stdout == ""
  assert message in proc.stderr
  assert "Traceback" not in proc.stderr
  assert len(proc.stderr.strip().splitlines()) == 1
