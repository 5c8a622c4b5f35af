r"""Scores retrieval runs, verification labels or generated explanations; prints one JSON line.

  python scripts/evaluate.py --task=retrieval --qrels=test/text_evidence_qrels_sentence_level.csv \
      --run=run.txt [--k=5,10]
  python scripts/evaluate.py --task=verification --gold=gold.csv --pred=pred.csv
  python scripts/evaluate.py --task=generation --refs=refs.csv --preds=preds.csv

Retrieval: qrels as Mocheg CSV or TREC qrels, the run in TREC format. Keys: P@k R@k NDCG@k
MAP@k per k, map, ndcg, MRR@10, num_queries, num_missing.
Verification: CSVs with `claim_id,label` (a class name or id 0/1/2; extra columns such as
p_refuted,p_supported,p_nei are ignored). Keys: accuracy, micro_f1, macro_f1, per-class
scores, confusion_matrix (rows gold, columns predicted), counts.
Generation: CSVs with `claim_id,explanation`. Keys: rouge1 rouge2 rougeL rougeLsum bleu, counts.
All scores are fractions in [0, 1]. Pairs are matched by claim_id; gold claims without a
prediction are an error unless --allow_missing. Unusable input: one line on stderr, exit 1.
"""

from __future__ import annotations

if __name__ == "__main__":  # First: a re-exec keeps nothing done before it.
  from mocheg_jax.utils import allocator
  allocator.run_under_preferred_allocator()

import json
import sys

from absl import app
from absl import flags

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.metrics import classification, generation, retrieval, trec

_TASK = flags.DEFINE_enum("task", None, ["retrieval", "verification", "generation"],
                          "What to score.", required=True)
_QRELS = flags.DEFINE_string("qrels", None, "retrieval: qrels file (Mocheg CSV or TREC).")
_RUN = flags.DEFINE_string("run", None, "retrieval: TREC run file.")
_K = flags.DEFINE_list("k", ["5", "10"], "retrieval: cut-offs for P/R/NDCG/MAP@k.")
_GOLD = flags.DEFINE_string("gold", None, "verification: gold labels CSV (claim_id,label).")
_PRED = flags.DEFINE_string("pred", None, "verification: predicted labels CSV.")
_REFS = flags.DEFINE_string("refs", None,
                            "generation: reference explanations CSV (claim_id,explanation).")
_PREDS = flags.DEFINE_string("preds", None, "generation: generated explanations CSV.")
_BLEU_TOKENIZER = flags.DEFINE_enum("bleu_tokenizer", "whitespace",
                                    sorted(generation.BLEU_TOKENIZERS),
                                    "generation: BLEU tokenization.")
_ALLOW_MISSING = flags.DEFINE_bool(
    "allow_missing", False,
    "Score gold claims without a prediction as wrong (verification) or empty (generation) "
    "instead of failing.")


def _require(**named: str | None) -> None:
  for name, value in named.items():
    if not value:
      raise MochegInputError(f"--task={_TASK.value} needs --{name}")


def _cutoffs() -> list[int]:
  try:
    ks = [int(k) for k in _K.value]
  except ValueError:
    raise MochegInputError(f"--k must be positive integers, got {','.join(_K.value)}") from None
  if not ks or min(ks) < 1:
    raise MochegInputError(f"--k must be positive integers, got {','.join(_K.value)}")
  return ks


def evaluate() -> dict:
  """The metrics the flags ask for."""
  if _TASK.value == "retrieval":
    _require(qrels=_QRELS.value, run=_RUN.value)
    ks = _cutoffs()
    qrels = trec.read_qrels(_QRELS.value)
    run = trec.read_run(_RUN.value)
    try:
      return retrieval.evaluate_run(qrels, run, ks=ks)
    except ValueError as e:  # No topic with a relevant document.
      raise MochegInputError(f"{_QRELS.value}: {e}") from None
  if _TASK.value == "verification":
    _require(gold=_GOLD.value, pred=_PRED.value)
    return classification.evaluate_label_files(_GOLD.value, _PRED.value,
                                               allow_missing=_ALLOW_MISSING.value)
  _require(refs=_REFS.value, preds=_PREDS.value)
  return generation.evaluate_text_files(_REFS.value, _PREDS.value,
                                        allow_missing=_ALLOW_MISSING.value,
                                        bleu_tokenizer=_BLEU_TOKENIZER.value)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  try:
    result = evaluate()
  except (MochegInputError, OSError) as e:
    print(f"evaluate.py: error: {e}", file=sys.stderr)
    sys.exit(1)
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
