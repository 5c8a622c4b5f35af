"""Searches again with the tiny main job's trained retrievers, in the job's own environment.

    python tests/rerun_retrieval.py WORKDIR OUT.json

Writes {"text": {"reranked" | "dense" | "system": {split: run}}, "candidates": {"first" |
"reranked": {dev split: run}}, "images": {N: run}} where a
run is {claim id: [[doc id, score], ...]} best first: every split of the result CSV searched
with the bi-encoder alone, reranked, and in the order the job chose (the two fused with its
dev-chosen weight; one of the other two at weight 0 or 1), as the retrieval stage searches,
and the image runs grounded on the job's chosen text run, for every grounding the retrieval
stage tries.

Why a subprocess: the tests compare these runs with the job's files, and the pytest process
compiles with other XLA flags (and 8 devices, not the job's 2), which round embeddings and
scores differently in the last bits; the tiny random models score many documents within
1e-6 of each other (identical sentences exactly alike), so such re-searches may order
near-tied documents otherwise. Run with `tiny_job.job_environment`, the same programs
compute the same numbers, and the comparison can ask for the same order.
"""

from __future__ import annotations

import json
import sys
from typing import Sequence


def _text_search(workdir: str, reranked: bool):
  """The job's text retriever, its index, the release folder and (`reranked`) the
  reranker, loaded once for all the splits searched."""
  from mocheg_jax.retrieval import system
  from mocheg_jax.train.restore import load_trained

  text = load_trained(f"{workdir}/stages/retrieval_text")
  index = system.open_index(text, f"{workdir}/index/text")
  release = f"{workdir}/release"
  rerank = (system.load_reranker(f"{workdir}/stages/rerank", "text", release)
            if reranked else None)
  return text, index, release, rerank


def text_runs(workdir: str, splits: Sequence[str], weight: float) -> dict:
  """{split: its claims' top 10 by the job's text retriever, its and the reranker's scores
  fused with `weight` (0: the bi-encoder alone, the reranker not run; 1: the reranker's
  order)}."""
  from mocheg_jax.retrieval import stage as retrieval_stage
  from mocheg_jax.retrieval import system

  text, index, release, rerank = _text_search(workdir, weight > 0)
  return {split: system.search_claims(text, index, release, split, 10, rerank=rerank,
                                      candidates=retrieval_stage.RERANK_CANDIDATES,
                                      rerank_weight=weight)
          for split in splits}


def candidate_runs(workdir: str, splits: Sequence[str]) -> dict:
  """{"first" | "reranked": {split: run}}: the bi-encoder's top RERANK_CANDIDATES of every
  claim and the reranker's order of them (the lists the job chose its fusion weight on)."""
  from mocheg_jax.retrieval import stage as retrieval_stage
  from mocheg_jax.retrieval import system

  text, index, release, rerank = _text_search(workdir, True)
  out = {"first": {}, "reranked": {}}
  for split in splits:
    out["first"][split], out["reranked"][split] = system.rerank_candidates(
        text, index, release, split, rerank, retrieval_stage.RERANK_CANDIDATES)
  return out


def image_runs(workdir: str, splits: Sequence[str], text: dict,
               articles: Sequence[int]) -> dict:
  """{N: {claim: top 10 images}} of the splits' claims by the job's image retriever,
  grounded on the text run `text` ({claim: ranked}) with N articles, for each N given."""
  from mocheg_jax.retrieval import system
  from mocheg_jax.train.restore import load_trained

  image = load_trained(f"{workdir}/stages/retrieval_image")
  index = system.open_index(image, f"{workdir}/index/image")
  return {n: {claim: ranked for split in splits for claim, ranked in
              system.search_claims(image, index, f"{workdir}/release", split, 10,
                                   ground=system.Grounding(text, n)).items()}
          for n in articles}


def main(workdir: str, out: str) -> None:
  from mocheg_jax.retrieval import stage as retrieval_stage

  with open(f"{workdir}/summary.json") as f:
    summary = json.load(f)
  text = {name: text_runs(workdir, retrieval_stage.RESULTS_SPLITS, weight)
          for name, weight in (("reranked", 1.0), ("dense", 0.0))}
  weight = summary["retrieval_system_text"]["weight"]
  text["system"] = ({1.0: text["reranked"], 0.0: text["dense"]}.get(weight)
                    or text_runs(workdir, retrieval_stage.RESULTS_SPLITS, weight))
  images = image_runs(workdir, retrieval_stage.RESULTS_SPLITS,
                      {c: r for run in text["system"].values() for c, r in run.items()},
                      retrieval_stage.IMAGE_ARTICLES)
  candidates = candidate_runs(workdir, [retrieval_stage.DEV_SPLIT])
  with open(out, "w") as f:
    json.dump({"text": text, "candidates": candidates, "images": images}, f)


if __name__ == "__main__":
  main(*sys.argv[1:])
