r"""Searches the KB index for a split's claims; writes a TREC run and the result CSV.

  python scripts/search.py --index=INDEX_DIR --checkpoint=WORKDIR --split=test --top_k=5 \
      --run=RUN_FILE [--results=RESULT_CSV] [--release=DIR] \
      [--rerank_checkpoint=WORKDIR --candidates=1000 [--rerank_weight=1.0]] \
      [--text_run=TEXT_RUN --articles=2]

The index must have been built by the same retriever checkpoint (else: an error saying which
encoder built it). Text: bi-encoder top-`candidates`, reranked by the cross-encoder to
`top_k` when --rerank_checkpoint is given (with --rerank_weight < 1, by the two models'
scores fused: mocheg_jax/retrieval/fusion.py). Image: top-`top_k`; with --text_run (a text run
of the same claims) and --articles=N, the images of the articles of each claim's top N text
hits come first (mocheg_jax/retrieval/grounding.py). The result CSV has one row
per claim (text and image columns; the other modality's columns of an existing file are
kept), read by verification and explanation as system evidence.
"""

from __future__ import annotations

if __name__ == "__main__":  # First: a re-exec keeps nothing done before it.
  from mocheg_jax.utils import allocator
  allocator.run_under_preferred_allocator()

import json

from absl import app
from absl import flags

from mocheg_jax.data.mocheg import SPLITS
from mocheg_jax.metrics import trec
from mocheg_jax.retrieval import system
from mocheg_jax.train.restore import WHICH, load_trained
from mocheg_jax.utils.cli import friendly_errors

_INDEX = flags.DEFINE_string("index", None, "The index folder (scripts/index.py).",
                             required=True)
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "The retriever's training workdir.",
                                  required=True)
_WHICH = flags.DEFINE_enum("which", "best", WHICH, "Which checkpoint of the workdir.")
_RELEASE = flags.DEFINE_string("release", None, "The release (default: the training one).")
_SPLIT = flags.DEFINE_enum("split", "test", list(SPLITS), "Whose claims are searched.")
_TOP_K = flags.DEFINE_integer("top_k", 5, "Results kept per claim.")
_RUN = flags.DEFINE_string("run", None, "TREC run file to write.")
_RESULTS = flags.DEFINE_string("results", None, "Retrieval result CSV to write or update.")
_RERANK = flags.DEFINE_string("rerank_checkpoint", None,
                              "A cross-encoder's training workdir (text only).")
_CANDIDATES = flags.DEFINE_integer("candidates", 1000,
                                   "Bi-encoder candidates per claim for the reranker.")
_RERANK_WEIGHT = flags.DEFINE_float(
    "rerank_weight", 1.0, "With --rerank_checkpoint: the cross-encoder's share when its "
    "and the bi-encoder's scores are fused (retrieval/fusion.py): 1 its order alone (the "
    "paper's), 0 the bi-encoder's; the main job's choice is settings.rerank_weight in its "
    "manifest.json.", lower_bound=0.0, upper_bound=1.0)
_TEXT_RUN = flags.DEFINE_string("text_run", None, "A TREC text run of the same claims to "
                                "ground an image search on (with --articles).")
_ARTICLES = flags.DEFINE_integer("articles", 2, "With --text_run: how many of each claim's "
                                 "best text hits' articles give their images first.")


@friendly_errors
def main(argv: list[str]) -> None:
  del argv
  if not (_RUN.value or _RESULTS.value):
    raise app.UsageError("give --run and/or --results")
  trained = load_trained(_CHECKPOINT.value, _WHICH.value)
  release = system.release_of(trained, _RELEASE.value)
  index = system.open_index(trained, _INDEX.value)
  rerank = (system.load_reranker(_RERANK.value, index.manifest.kind, release)
            if _RERANK.value else None)
  if _TEXT_RUN.value and _ARTICLES.value < 1:
    raise app.UsageError(f"--articles must be >= 1 with --text_run, not {_ARTICLES.value}")
  ground = (system.Grounding(trec.read_run(_TEXT_RUN.value), _ARTICLES.value)
            if _TEXT_RUN.value else None)
  run = system.search_claims(trained, index, release, _SPLIT.value, _TOP_K.value,
                             rerank=rerank, candidates=_CANDIDATES.value, ground=ground,
                             rerank_weight=_RERANK_WEIGHT.value)
  tag = "rerank" if rerank else "grounded" if ground else "dense"
  system.write_outputs(run, index.manifest.kind, run_path=_RUN.value,
                       results_path=_RESULTS.value, release_dir=release, tag=tag)
  print(json.dumps({"claims": len(run), "kind": index.manifest.kind, "top_k": _TOP_K.value,
                    "reranked": bool(rerank),
                    "rerank_weight": _RERANK_WEIGHT.value if rerank else None,
                    "grounded_articles": ground and ground.articles,
                    "run": _RUN.value, "results": _RESULTS.value}))


if __name__ == "__main__":
  app.run(main)
