"""The README's main job, end to end on the tiny world (data, retrieval stage with Table 3),
and its resume behaviour."""

import json
import os

from mocheg_jax import workflow
from mocheg_jax.retrieval.results import read_results


def test_main_job_runs_and_resumes(tmp_path):
  lines = []
  summary = workflow.run("tiny", str(tmp_path), seed=0, log=lines.append)
  text = "\n".join(lines)
  assert "| refuted / supported / NEI |" in text and "KB: " in text
  assert set(summary["batches"]) == {"text_retrieval", "image_retrieval", "verification",
                                     "explanation"}
  assert summary["batches"]["verification"]["images"] == [4, 2, 64, 64, 3]
  assert sum(summary["splits"][s]["claims"] for s in ("train", "val", "test")) >= 90
  systems = {(r["system"], r["modality"]) for r in summary["retrieval"]}
  assert systems == {("BM25", "text"), ("SBERT zero-shot", "text"), ("SBERT fine-tuned", "text"),
                     ("SBERT + rerank", "text"), ("CLIP fine-tuned", "image")}
  assert "| SBERT + rerank | text | 5 |" in text  # Table 3 printed.
  results = read_results(tmp_path / "runs" / "retrieval_results.csv")
  assert len(results) == summary["splits"]["test"]["claims"]
  assert all(len(r.text_ids) == 10 and len(r.images) == 10 for r in results.values())
  on_disk = json.load(open(tmp_path / "summary.json"))
  assert on_disk["batches"] == summary["batches"]
  # A second run reuses every finished step (the world is not rewritten).
  stamp = os.path.getmtime(tmp_path / "release" / "Corpus3.csv")
  lines.clear()
  workflow.run("tiny", str(tmp_path), seed=0, log=lines.append)
  assert any("reused from" in line for line in lines)
  assert os.path.getmtime(tmp_path / "release" / "Corpus3.csv") == stamp
