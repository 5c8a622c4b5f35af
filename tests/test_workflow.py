"""The README's main job, end to end on the tiny world (data, retrieval stage with Table 3),
its resume behaviour, and the retrieval scripts run on what it trained."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from mocheg_jax import workflow
from mocheg_jax.metrics import trec
from mocheg_jax.retrieval.results import read_results

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def main_job(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("main_job")
  lines = []
  summary = workflow.run("tiny", str(workdir), seed=0, log=lines.append)
  return workdir, summary, "\n".join(lines)


def test_main_job_runs_and_resumes(main_job):
  workdir, summary, text = main_job
  assert "| refuted / supported / NEI |" in text and "KB: " in text
  assert set(summary["batches"]) == {"text_retrieval", "image_retrieval", "verification",
                                     "explanation"}
  assert summary["batches"]["verification"]["images"] == [4, 2, 64, 64, 3]
  assert sum(summary["splits"][s]["claims"] for s in ("train", "val", "test")) >= 90
  systems = {(r["system"], r["modality"]) for r in summary["retrieval"]}
  assert systems == {("BM25", "text"), ("SBERT zero-shot", "text"), ("SBERT fine-tuned", "text"),
                     ("SBERT + rerank", "text"), ("CLIP fine-tuned", "image")}
  assert "| SBERT + rerank | text | 5 |" in text  # Table 3 printed.
  table4 = {(r["system"], r["evidence"]) for r in summary["verification"]}
  assert table4 == {("Majority", "-"), ("Average similarity", "gold"),
                    ("Average similarity", "system"), ("Stance (none)", "-")} | {
                        (f"Stance ({m})", e) for m in ("text+image", "text", "image")
                        for e in ("gold", "system")}
  assert all(r["claims"] == summary["splits"]["test"]["claims"]
             for r in summary["verification"])
  assert "| Stance (text+image) | gold |" in text  # Table 4 printed.
  results = read_results(workdir / "runs" / "retrieval_results.csv")
  assert len(results) == summary["splits"]["test"]["claims"]
  assert all(len(r.text_ids) == 10 and len(r.images) == 10 for r in results.values())
  on_disk = json.load(open(workdir / "summary.json"))
  assert on_disk["batches"] == summary["batches"]
  # A second run reuses every finished step (the world is not rewritten).
  stamp = os.path.getmtime(workdir / "release" / "Corpus3.csv")
  lines = []
  workflow.run("tiny", str(workdir), seed=0, log=lines.append)
  assert any("reused from" in line for line in lines)
  assert os.path.getmtime(workdir / "release" / "Corpus3.csv") == stamp


def _script(name: str, *args: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)  # One CPU device: the scripts' default machine.
  return subprocess.run([sys.executable, f"scripts/{name}", *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=600)


def _fails_with(proc: subprocess.CompletedProcess, message: str) -> None:
  assert proc.returncode == 1, (proc.stdout, proc.stderr)
  assert "Traceback" not in proc.stderr and message in proc.stderr, proc.stderr


def test_search_and_index_scripts(main_job, tmp_path):
  workdir, _, _ = main_job
  stages, index = workdir / "stages", workdir / "index"
  text, image, rerank = (f"--checkpoint={stages / s}" for s in ("retrieval_text",
                                                                 "retrieval_image", "rerank"))
  # The main job's text index, searched and reranked from the command line.
  run, results = tmp_path / "text.run", tmp_path / "results.csv"
  proc = _script("search.py", f"--index={index / 'text'}", text, "--split=test", "--top_k=3",
                 f"--run={run}", f"--results={results}", f"--rerank_checkpoint={stages / 'rerank'}",
                 "--candidates=20")
  assert proc.returncode == 0, proc.stderr
  report = json.loads(proc.stdout.strip().splitlines()[-1])
  assert report["reranked"] and report["kind"] == "text"
  ranked = trec.read_run(run)
  assert len(ranked) == report["claims"] and all(len(r) == 3 for r in ranked.values())
  rows = read_results(results)
  claim = next(iter(rows.values()))
  assert list(claim.text_ids) == [d for d, _ in ranked[str(claim.claim_id)]]

  # Bad input: another encoder's index, a reranker on images, a missing shard, and an index
  # that does not hold the release's KB.
  _fails_with(_script("search.py", f"--index={index / 'text'}", image, f"--run={run}"),
              "the index was built by another encoder")
  _fails_with(_script("search.py", f"--index={index / 'image'}", image, rerank.replace(
      "--checkpoint", "--rerank_checkpoint"), f"--run={run}"),
              "a reranker reorders text evidence, but the index holds images")
  _fails_with(_script("index.py", image, f"--out={index / 'text'}"),
              "the index there was started with kind='text' (this run: 'image')")
  broken = tmp_path / "broken"
  shutil.copytree(index / "text", broken)
  (broken / "shard-00000.npy").unlink()
  _fails_with(_script("search.py", f"--index={broken}", text, f"--run={run}"),
              f"{broken / 'shard-00000.npy'}: missing shard")
  other = tmp_path / "other_release"
  shutil.copytree(workdir / "release", other, ignore=shutil.ignore_patterns("images"))
  sentences = other / "supplementary" / "Corpus3_sentence_level.csv"
  kept = sentences.read_text().splitlines(keepends=True)  # One sentence per line.
  sentences.write_text("".join(kept[:len(kept) // 2]))
  _fails_with(_script("search.py", f"--index={index / 'text'}", text, f"--release={other}",
                      f"--run={run}"),
              "the index does not match the text KB of")
