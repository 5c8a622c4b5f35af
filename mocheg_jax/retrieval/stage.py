"""The retrieval stage of the main job: train, index, search, and print Table 3.

Trains the text retriever, the cross-encoder reranker and the image retriever (a random
CLIP after caption pre-training, caption_task.py) on the prepared world, indexes the KB
with each, searches for the test claims, and scores them beside a BM25 baseline and the
zero-shot (not fine-tuned) text encoder. The text evidence in
WORKDIR/runs/retrieval_results.csv (the system evidence of Tables 4 and 5, for the test,
dev and train claims) is the reranked run or the bi-encoder's, whichever did better on dev
(`choose_text_system`); Table 3 also scores the two models' scores fused with the best mix
on dev (fusion.py). runs/text.run is always the reranked test run. The image evidence
there and in runs/image.run is the global CLIP ranking or one grounded on the system text
evidence's articles (grounding.py), whichever did better on dev (`choose_image_system`);
Table 3 shows both.
Everything lands under WORKDIR and is reused on a rerun: a finished training is not
repeated (the trainer resumes to its last step), an index is complete or resumed, runs are
rewritten.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Callable, Sequence

import ml_collections

from mocheg_jax.data.mocheg import MochegRelease
from mocheg_jax.metrics import retrieval as retrieval_metrics
from mocheg_jax.parallel import distributed
from mocheg_jax.retrieval import bm25 as bm25_lib
from mocheg_jax.retrieval import fusion
from mocheg_jax.retrieval import image_task
from mocheg_jax.retrieval import system
from mocheg_jax.retrieval import table3
from mocheg_jax.retrieval import text_task
from mocheg_jax.train import evaluations, loop
from mocheg_jax.train.restore import Trained, load_trained, untrained
from mocheg_jax.utils import configs

SPLIT = "test"
# The split the retrievers were selected on; its claims are searched too (the verification
# stage's dev system evidence).
DEV_SPLIT = text_task.DEV_SPLIT
# The claims the result CSV holds: the train claims' rows train a verifier on evidence like
# the test claims' (the verification stage), the dev claims' choose among the verifiers.
RESULTS_SPLITS = ("train", DEV_SPLIT, SPLIT)
TOP_K = 10  # Runs keep 10 per claim: Table 3 reports K = 5 and 10.
RERANK_CANDIDATES = 100  # Bi-encoder candidates the cross-encoder reorders (1000 on the paper).
BI_ENCODER, RERANKED = "SBERT fine-tuned", "SBERT + rerank"  # Table 3's rows of the two.
CLIP = "CLIP fine-tuned"  # Table 3's row of the paper's image ranking.
# Groundings of the image search on the system text evidence tried (grounding.py: the
# images of the articles of a claim's top N text hits first); 0 is the paper's ranking.
IMAGE_ARTICLES = (0, 1, 2, 3, 4, 5)
# The fusion weights (fusion.py) the system evidence may take: the bi-encoder's order or the
# paper's reranking. Table 3 also shows the best mix on dev, but the verifiers read the mixed
# lists worse though they hold more gold sentences (small world, seed 0, w 0.6: test
# recall@5 84.6 against 83.7 reranked; the gold-trained text+image / text-only verifiers
# on them 56.2 / 64.8 macro F1 against 60.1 / 67.9, the system-trained one retrained on them
# 72.0 against 74.4): the bi-encoder's favourites it brings back include the articles'
# restatements of the claim, which the verifiers take for support.
SYSTEM_WEIGHTS = (0.0, 1.0)
# What the evaluation writes (relative to WORKDIR): a rerun reuses it while these are intact.
OUTPUTS = ("index/text_zero_shot", "index/text", "index/image", "runs/text.run",
           "runs/image.run", "runs/retrieval_results.csv", "table3.json", "table3.md",
           "retrieval_summary.json")


def _train(name: str, config, workdir: str, log: Callable[[str], None]) -> str:
  stage_dir = os.path.join(workdir, "stages", name)
  log(f"training {name} ({config.data.scale}) in {stage_dir}")
  loop.train_stage(config, stage_dir, log=log)
  return stage_dir


def _dense_run(trained: Trained, index_dir: str, release: str) -> system.Run:
  system.build_index(trained, release, index_dir, progress=True)
  return system.search_claims(trained, system.open_index(trained, index_dir), release, SPLIT,
                              TOP_K)


def run(workdir: str, scale: str, seed: int = 0, log: Callable[[str], None] = print, *,
        release: str = "", overrides: configs.Overrides | None = None) -> dict:
  """Runs the stage on `release` (default: the synthetic world in WORKDIR/release) with
  configs/NAME.py:SCALE and `overrides`; returns {"rows": Table 3 rows, "table": markdown}."""
  release_dir = configs.release_dir(workdir, release)
  stage_config = functools.partial(configs.stage_config, scale=scale, workdir=workdir,
                                   seed=seed, release=release, overrides=overrides)
  text_config = stage_config("retrieval_text")
  text_dir = _train("retrieval_text", text_config, workdir, log)
  rerank_config = stage_config("rerank")
  rerank_config.rerank.retriever = text_dir  # Hard negatives mined with our bi-encoder.
  rerank_dir = _train("rerank", rerank_config, workdir, log)
  image_config = stage_config("retrieval_image")
  if image_config.model.init == image_task.RANDOM:
    # A CLIP without pre-training first learns what pictures show from captions (the
    # synthetic worlds' stand-in for CLIP's web pre-training; caption_task.py).
    captions_config = stage_config("captions")
    captions_config.model = ml_collections.ConfigDict(image_config.model.to_dict())
    image_config.model.init = _train("captions", captions_config, workdir, log)
  image_dir = _train("retrieval_image", image_config, workdir, log)

  def evaluate() -> dict:
    inputs = {"trained": [evaluations.trained(d) for d in (text_dir, rerank_dir, image_dir)],
              "zero_shot": text_config.to_dict(), "release": release_dir,
              "release_files": evaluations.folder_sizes(release_dir),
              "settings": {"split": SPLIT, "top_k": TOP_K, "candidates": RERANK_CANDIDATES,
                           "system_text": {"fusion weight best on dev of": list(SYSTEM_WEIGHTS),
                                           "table 3 mix best on dev of": list(fusion.WEIGHTS)},
                           "results_splits": list(RESULTS_SPLITS),
                           "system_image": {"best on dev of articles": list(IMAGE_ARTICLES)}}}
    out = evaluations.reuse(workdir, "retrieval", inputs, OUTPUTS, lambda: _evaluate(
        workdir, text_dir, rerank_dir, image_dir, text_config, release_dir), log)
    log("\nTable 3 (test split, synthetic world):\n" + out["table"])
    log(f"system text evidence: {describe_choice(out['system_text'])}")
    log(f"system image evidence: {describe_choice(out['system_image'])}")
    return out

  # The trainings above are collective; the rest is process 0's alone.
  return distributed.primary_only("retrieval_stage", evaluate)


def _evaluate(workdir: str, text_dir: str, rerank_dir: str, image_dir: str,
              text_config, release_dir: str) -> dict:
  """Indexes and searches with the trained models, writes the runs and Table 3."""
  reader = MochegRelease(release_dir)
  claims = reader.claims(SPLIT)
  claim_ids = [str(c.claim_id) for c in claims]
  qrels = {"text": {str(k): v for k, v in reader.text_qrels(SPLIT).items()},
           "image": {str(k): v for k, v in reader.image_qrels(SPLIT).items()}}
  kb = system.corpus(reader, "text")
  runs_dir = os.path.join(workdir, "runs")
  results_csv = os.path.join(runs_dir, "retrieval_results.csv")
  rows = []

  def score(name: str, runs: dict, semantic=None):
    rows.extend(table3.table3_rows(name, runs, qrels, semantic=semantic,
                                   texts={"text": kb.texts}, claim_ids=claim_ids))

  bm25 = bm25_lib.BM25.build(kb.ids, kb.items)
  score("BM25", {"text": dict(zip(claim_ids, bm25.search([c.claim for c in claims], TOP_K)))})
  text = load_trained(text_dir)
  encode_text = lambda items: text.task.inference.encode_documents(text.model, items)
  zero = untrained(text_config, text_dir)
  score("SBERT zero-shot", {"text": _dense_run(
      zero, os.path.join(workdir, "index", "text_zero_shot"), release_dir)},
      {"text": encode_text})
  text_run = _dense_run(text, os.path.join(workdir, "index", "text"), release_dir)
  score(BI_ENCODER, {"text": text_run}, {"text": encode_text})

  text_index = system.open_index(text, os.path.join(workdir, "index", "text"))
  reranker = system.load_reranker(rerank_dir, "text", release_dir, progress=True)
  # The bi-encoder's top candidates and their reranked order: the dev claims' choose the
  # system evidence's order and the best mix, the test claims' give Table 3's reranked row
  # (the paper's order) and the mix's.
  candidates = {split: system.rerank_candidates(text, text_index, release_dir, split,
                                                reranker, RERANK_CANDIDATES)
                for split in (DEV_SPLIT, SPLIT)}
  choice = choose_text_system(*candidates[DEV_SPLIT], reader.text_qrels(DEV_SPLIT))
  weight = choice["weight"]
  reranked = fusion.fuse_run(*candidates[SPLIT], 1.0, TOP_K)
  system.write_outputs(reranked, "text", run_path=os.path.join(runs_dir, "text.run"),
                       results_path=None, release_dir=release_dir, tag="rerank")
  score(RERANKED, {"text": reranked}, {"text": encode_text})
  for w in sorted({choice["fused_weight"], weight}):  # Table 3's rows of the mixes.
    if 0.0 < w < 1.0:
      score(fused_name(w), {"text": fusion.fuse_run(*candidates[SPLIT], w, TOP_K)},
            {"text": encode_text})

  # The other claims of the result CSV are searched the same way (the bi-encoder's order
  # needs no reranking).
  system_text = {split: fusion.fuse_run(*candidates[split], weight, TOP_K)
                 if split in candidates else
                 system.search_claims(text, text_index, release_dir, split, TOP_K,
                                      rerank=reranker if weight > 0.0 else None,
                                      candidates=RERANK_CANDIDATES, rerank_weight=weight)
                 for split in RESULTS_SPLITS}
  system.write_outputs(_merged(system_text), "text", run_path=None, results_path=results_csv,
                       release_dir=release_dir, tag="system")

  image = load_trained(image_dir)
  image_index_dir = os.path.join(workdir, "index", "image")
  system.build_index(image, release_dir, image_index_dir, progress=True)
  image_index = system.open_index(image, image_index_dir)
  # Every grounding (0: the paper's global CLIP ranking) for the dev and test claims; dev
  # chooses; the train claims get the chosen one.
  image_runs = {split: system.search_grounded(image, image_index, release_dir, split, TOP_K,
                                              system_text[split], IMAGE_ARTICLES)
                for split in (DEV_SPLIT, SPLIT)}
  image_choice = choose_image_system(image_runs[DEV_SPLIT], reader.image_qrels(DEV_SPLIT))
  chosen = image_choice["articles"]
  system_images = {split: image_runs[split][chosen] if split in image_runs else
                   system.search_grounded(image, image_index, release_dir, split, TOP_K,
                                          system_text[split], (chosen,))[chosen]
                   for split in RESULTS_SPLITS}
  system.write_outputs(system_images[SPLIT], "image",
                       run_path=os.path.join(runs_dir, "image.run"), results_path=None,
                       release_dir=release_dir, tag="clip")
  system.write_outputs(_merged(system_images), "image", run_path=None,
                       results_path=results_csv, release_dir=release_dir, tag="clip")
  images = system.corpus(reader, "image")
  for n in (0, image_choice["best_grounded"]):
    rows.extend(table3.table3_rows(
        image_system_name(n), {"image": image_runs[SPLIT][n]}, qrels,
        semantic={"image": lambda items: image.task.inference.encode_documents(image.model,
                                                                               items)},
        texts={"image": dict(zip(images.ids, images.items))}, claim_ids=claim_ids))

  markdown = table3.format_table(rows)
  table3.write_rows(os.path.join(workdir, "table3.json"), rows)
  with open(os.path.join(workdir, "table3.md"), "w") as f:
    f.write(markdown + "\n")
  with open(os.path.join(workdir, "retrieval_summary.json"), "w") as f:
    json.dump({"text_step": text.step, "image_step": image.step, "results": results_csv,
               "system_text": choice, "system_image": image_choice}, f)
  return {"rows": rows, "table": markdown, "system_text": choice, "system_image": image_choice}


def _merged(runs: dict[str, system.Run]) -> system.Run:
  """The claims of every split in one run (the result CSV is written whole: its rows are
  the run's claims)."""
  return {claim: ranked for split in RESULTS_SPLITS for claim, ranked in runs[split].items()}


def choose_text_system(dev_first: system.Run, dev_reranked: system.Run, dev_qrels: dict,
                       weights: Sequence[float] = SYSTEM_WEIGHTS) -> dict:
  """Which text ranking the later stages read as system evidence (the result CSV) and the
  fact-checker uses: the dev claims' candidates in the order of each fusion weight in
  `weights` (fusion.py; 0: the bi-encoder's, 1: the paper's reranking), and the one with
  the best dev recall@5 is chosen; also the best mix of all fusion.WEIGHTS, Table 3's
  fused row.

  The choice is made on the lists the system reads (the bi-encoder's top
  RERANK_CANDIDATES of the whole KB), not on the reranker's training-time dev figures (its
  own mined candidates). A reranker worse than the bi-encoder is not used: the small world's
  150-step one halved the recall@5 of the system evidence when its order was read (test
  44.8 against 78.5).

  Returns {"weight": the chosen w, "reranked": w > 0, "system": its Table 3 row,
  "fused_weight": the best of fusion.WEIGHTS, "metric": name, "dev": {row: value} for the
  two pure orders and the mixes named, "dev_by_weight": {"w": value} for every weight
  tried}.
  """
  qrels = {str(k): v for k, v in dev_qrels.items()}
  # Every weight scored once: the system's candidates and Table 3's mixes.
  scored = fusion.choose_weight(dev_first, dev_reranked, qrels,
                                sorted(set(fusion.WEIGHTS) | {float(w) for w in weights}))
  by_weight = scored["by_weight"]  # Empty without a judged dev claim: the paper's order.
  weight = fusion.best_weight(by_weight, weights) if by_weight else 1.0
  fused = fusion.best_weight(by_weight, fusion.WEIGHTS) if by_weight else 1.0
  dev = {BI_ENCODER: by_weight.get(0.0), RERANKED: by_weight.get(1.0)}
  dev |= {fused_name(w): by_weight[w] for w in (fused, weight) if 0.0 < w < 1.0}
  return {"weight": weight, "reranked": weight > 0.0, "system": text_system_name(weight),
          "fused_weight": fused, "metric": scored["metric"], "dev": dev,
          "dev_by_weight": {f"{w:.1f}": value for w, value in sorted(by_weight.items())}}


def fused_name(weight: float) -> str:
  return f"{RERANKED} (fused, w {weight:.1f})"


def text_system_name(weight: float) -> str:
  return BI_ENCODER if weight == 0.0 else RERANKED if weight == 1.0 else fused_name(weight)


def image_system_name(articles: int) -> str:
  return CLIP if articles == 0 else f"CLIP + text articles (top {articles})"


def choose_image_system(dev_runs: dict[int, system.Run], dev_qrels: dict) -> dict:
  """Which image ranking the later stages read as system evidence and the fact-checker uses:
  the paper's global CLIP ranking (0) or one grounded on the text evidence's top N articles
  (grounding.py), whichever has the best recall@5 on the dev claims (ties: the smaller N).

  Returns {"articles": the chosen N, "system": its Table 3 row, "best_grounded": the best
  N > 0, "metric": "dev/recall@5", "dev": {row: value}}.
  """
  qrels = {str(k): v for k, v in dev_qrels.items()}
  dev = {n: retrieval_metrics.evaluate_run(qrels, run, ks=(5,))["R@5"]
         for n, run in dev_runs.items()}
  best = lambda ns: max(ns, key=lambda n: (dev[n], -n))
  articles = best(dev)
  return {"articles": articles, "system": image_system_name(articles),
          "best_grounded": best([n for n in dev if n > 0]), "metric": "dev/recall@5",
          "dev": {image_system_name(n): value for n, value in dev.items()}}


def describe_choice(choice: dict) -> str:
  dev = ", ".join(f"{name} {'-' if v is None else f'{v:.4f}'}"
                  for name, v in choice["dev"].items())
  return f"{choice['system']} ({choice['metric'] or 'no shared dev metric'}: {dev})"
