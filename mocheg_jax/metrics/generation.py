"""Explanation generation metrics: ROUGE, corpus BLEU and BERTScore, as the paper computes them.

* ROUGE-1/2/L/Lsum F-measure from the `rouge-score` package (its tokenizer: lower-cased,
  non-alphanumerics removed, Porter stemming). Predictions and references are first split
  into sentences (`mocheg_jax.data.text.split_sentences`) and joined by newlines, which is
  how rougeLsum sees sentence boundaries. The reported figure is the plain mean over pairs
  (the reference's HF `rouge` metric reports the bootstrap "mid", which is the same mean up
  to resampling noise).
* BLEU: corpus-level BLEU-4 with uniform weights, brevity penalty, no smoothing and one
  reference per prediction (the HF/`nmt` `compute_bleu` definition the reference used).
  n-gram matches and counts are summed over the corpus; a hypothesis shorter than n adds 0
  possible n-grams (nltk adds 1 there; otherwise the two agree). BLEU is 0 when any
  n-gram precision is 0. Tokenizers (`BLEU_TOKENIZERS`):
    - "whitespace" (default): `str.split()`, case kept, punctuation left attached to words.
      This is the reference's tokenization (`text.split(' ')`), so figures are comparable
      with the paper's, except that the reference also glued words across the newlines it
      put between sentences, which we do not reproduce.
    - "13a": the mteval-v13a tokenizer that sacreBLEU uses by default (case kept, punctuation
      split off, periods and commas kept inside numbers).
* BERTScore with a pluggable token embedder: greedy cosine matching, no idf weighting, no
  baseline rescaling, mean over pairs. The paper used roberta-large layer 17; this module
  takes any `embed_tokens(texts) -> [array [T_i, D]]` so our own encoders can be used.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import os
import re
from typing import Callable, Sequence

import numpy as np
from nltk.stem import porter
from rouge_score import rouge_scorer
from rouge_score import tokenize as rouge_tokenize
from rouge_score import tokenizers as rouge_tokenizers

from mocheg_jax.data.text import split_sentences
from mocheg_jax.metrics import keyed_csv

ROUGE_TYPES: tuple[str, ...] = ("rouge1", "rouge2", "rougeL", "rougeLsum")
MAX_ORDER = 4


def _check_pairs(predictions: Sequence[str], references: Sequence[str]) -> None:
  if len(predictions) != len(references):
    raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
  if not predictions:
    raise ValueError("no prediction/reference pairs to score")


def sentences_per_line(text: str) -> str:
  """The text's sentences joined by newlines (rougeLsum's sentence boundaries)."""
  return "\n".join(split_sentences(text))


class _CachedPorterStemmer:
  """nltk's Porter stemmer with memoised results (stemming is half of ROUGE's run time).

  The stemmer is deterministic, so the tokens are exactly those of rouge-score's default
  tokenizer with use_stemmer=True.
  """

  def __init__(self) -> None:
    self.stem = functools.lru_cache(maxsize=1 << 18)(porter.PorterStemmer().stem)


class _StemmingTokenizer(rouge_tokenizers.Tokenizer):
  """rouge-score's default tokenization (lower case, alphanumerics, Porter stems)."""

  def __init__(self) -> None:
    self._stemmer = _CachedPorterStemmer()

  def tokenize(self, text: str) -> list[str]:
    return rouge_tokenize.tokenize(text, self._stemmer)


def rouge_scores(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
  """Mean ROUGE-1/2/L/Lsum F-measures (fractions) over prediction/reference pairs."""
  _check_pairs(predictions, references)
  scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), tokenizer=_StemmingTokenizer())
  totals = dict.fromkeys(ROUGE_TYPES, 0.0)
  for prediction, reference in zip(predictions, references):
    scores = scorer.score(sentences_per_line(reference), sentences_per_line(prediction))
    for name in ROUGE_TYPES:
      totals[name] += scores[name].fmeasure
  return {name: total / len(predictions) for name, total in totals.items()}


# ----- BLEU -----

# mteval-v13a: ASCII punctuation that becomes its own token, except ' , - . (handled below).
_13A_PUNCTUATION = re.compile(r"([{-~\[-` -&(-+:-@/])")
_13A_PERIOD_COMMA_AFTER = re.compile(r"([^0-9])([.,])")
_13A_PERIOD_COMMA_BEFORE = re.compile(r"([.,])([^0-9])")
_13A_DIGIT_DASH = re.compile(r"([0-9])(-)")


def tokenize_13a(text: str) -> list[str]:
  """mteval-v13a tokenization, case preserved."""
  text = text.replace("<skipped>", "").replace("-\n", "").replace("\n", " ")
  if "&" in text:
    text = (text.replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<")
            .replace("&gt;", ">"))
  text = f" {text} "
  text = _13A_PUNCTUATION.sub(r" \1 ", text)
  text = _13A_PERIOD_COMMA_AFTER.sub(r"\1 \2 ", text)
  text = _13A_PERIOD_COMMA_BEFORE.sub(r" \1 \2", text)
  text = _13A_DIGIT_DASH.sub(r"\1 \2 ", text)
  return text.split()


def tokenize_whitespace(text: str) -> list[str]:
  """Whitespace tokens, case and punctuation kept (the reference's BLEU tokenization)."""
  return text.split()


BLEU_TOKENIZERS: dict[str, Callable[[str], list[str]]] = {
    "whitespace": tokenize_whitespace,
    "13a": tokenize_13a,
}


@dataclasses.dataclass(frozen=True)
class BleuStats:
  bleu: float
  precisions: tuple[float, ...]  # Modified n-gram precisions, n = 1..4.
  brevity_penalty: float
  hypothesis_length: int
  reference_length: int


def _ngrams(tokens: Sequence[str], n: int) -> collections.Counter:
  return collections.Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def corpus_bleu_tokens(hypotheses: Sequence[Sequence[str]],
                       references: Sequence[Sequence[str]]) -> BleuStats:
  """Corpus BLEU-4 of tokenized hypotheses, one tokenized reference each."""
  _check_pairs(hypotheses, references)
  matches = [0] * MAX_ORDER
  possible = [0] * MAX_ORDER
  hyp_len = ref_len = 0
  for hyp, ref in zip(hypotheses, references):
    hyp_len += len(hyp)
    ref_len += len(ref)
    for n in range(1, MAX_ORDER + 1):
      hyp_counts = _ngrams(hyp, n)
      ref_counts = _ngrams(ref, n)
      # Clipped counts: an n-gram matches at most as often as the reference holds it.
      matches[n - 1] += sum(min(c, ref_counts[g]) for g, c in hyp_counts.items())
      possible[n - 1] += max(len(hyp) - n + 1, 0)
  precisions = tuple(m / p if p else 0.0 for m, p in zip(matches, possible))
  if hyp_len == 0:
    bp = 0.0
  elif hyp_len > ref_len:
    bp = 1.0
  else:
    bp = math.exp(1.0 - ref_len / hyp_len)
  if min(precisions) > 0:
    bleu = bp * math.exp(sum(math.log(p) for p in precisions) / MAX_ORDER)
  else:
    bleu = 0.0
  return BleuStats(bleu=bleu, precisions=precisions, brevity_penalty=bp,
                   hypothesis_length=hyp_len, reference_length=ref_len)


def corpus_bleu(predictions: Sequence[str], references: Sequence[str],
                tokenizer: str = "whitespace") -> float:
  """Corpus-level BLEU-4 (a fraction in [0, 1]); see the module docstring for the rules.

  Args:
    predictions: generated texts.
    references: one reference text per prediction.
    tokenizer: a key of `BLEU_TOKENIZERS` ("whitespace" or "13a").
  """
  if tokenizer not in BLEU_TOKENIZERS:
    raise ValueError(f"unknown BLEU tokenizer {tokenizer!r}; expected one of "
                     f"{sorted(BLEU_TOKENIZERS)}")
  tokenize = BLEU_TOKENIZERS[tokenizer]
  return corpus_bleu_tokens([tokenize(p) for p in predictions],
                            [tokenize(r) for r in references]).bleu


# ----- BERTScore -----

def _unit_rows(x: np.ndarray) -> np.ndarray:
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def bert_score(candidates: Sequence[str], references: Sequence[str],
               embed_tokens: Callable[[list[str]], Sequence[np.ndarray]],
               batch_size: int = 64) -> dict[str, float]:
  """BERTScore precision, recall and F1, averaged over candidate/reference pairs.

  Per pair, with C the cosine matrix [candidate tokens, reference tokens]:
  precision = mean over candidate tokens of the row max, recall = mean over reference tokens
  of the column max, F1 = 2PR / (P + R) (0 when P + R = 0). A pair where either side has
  no token scores 0.

  Args:
    candidates: generated texts.
    references: one reference per candidate.
    embed_tokens: texts -> one array [T_i, D] per text, holding exactly the tokens to match
      (special tokens such as [CLS]/[SEP] or <s>/</s> already removed, as BERTScore does).
    batch_size: pairs per `embed_tokens` call (each call embeds 2 * batch_size texts), which
      bounds the memory held by token embeddings.

  Returns:
    `precision`, `recall`, `f1` (fractions).
  """
  _check_pairs(candidates, references)
  if batch_size < 1:
    raise ValueError(f"batch_size must be positive, got {batch_size}")
  totals = np.zeros(3)
  for start in range(0, len(candidates), batch_size):
    cands = list(candidates[start:start + batch_size])
    refs = list(references[start:start + batch_size])
    embedded = list(embed_tokens(cands + refs))
    if len(embedded) != len(cands) + len(refs):
      raise ValueError(f"embed_tokens returned {len(embedded)} arrays for "
                       f"{len(cands) + len(refs)} texts")
    for c_emb, r_emb in zip(embedded[:len(cands)], embedded[len(cands):]):
      c_emb = np.asarray(c_emb, dtype=np.float64)
      r_emb = np.asarray(r_emb, dtype=np.float64)
      if c_emb.ndim != 2 or r_emb.ndim != 2:
        raise ValueError(f"embed_tokens must return [T, D] arrays, got shapes "
                         f"{c_emb.shape} and {r_emb.shape}")
      if len(c_emb) == 0 or len(r_emb) == 0:
        continue  # Scores 0.
      cos = _unit_rows(c_emb) @ _unit_rows(r_emb).T  # [T_cand, T_ref]
      p = cos.max(axis=1).mean()
      r = cos.max(axis=0).mean()
      f = 2 * p * r / (p + r) if p + r != 0 else 0.0  # As bert-score: 0 only when P+R=0.
      totals += (p, r, f)
  mean = totals / len(candidates)
  return {"precision": float(mean[0]), "recall": float(mean[1]), "f1": float(mean[2])}


# ----- Files -----

def read_texts_csv(path: str | os.PathLike, column: str = "explanation") -> dict[str, str]:
  """claim_id -> text from a CSV with `claim_id` and `explanation` columns.

  Raises:
    MochegInputError: missing file/column or a duplicate claim id (named by file and row).
  """
  return keyed_csv.read_keyed_csv(path, column, str)


def evaluate_text_files(refs_path: str | os.PathLike, preds_path: str | os.PathLike,
                        allow_missing: bool = False,
                        bleu_tokenizer: str = "whitespace") -> dict:
  """ROUGE and BLEU of a predictions CSV against a references CSV, paired by claim id.

  Gold claims without a prediction are an error unless `allow_missing`, in which case they
  are scored against an empty prediction. Predictions for unknown claims are ignored.

  Returns:
    `rouge1 rouge2 rougeL rougeLsum bleu` (fractions), `num_pairs`, `num_missing`,
    `num_extra_predictions`.
  """
  paired = keyed_csv.pair_by_id(
      read_texts_csv(refs_path), read_texts_csv(preds_path), "",
      allow_missing=allow_missing, gold_name=os.fspath(refs_path),
      pred_name=os.fspath(preds_path))
  result: dict = rouge_scores(paired.pred, paired.gold)
  result["bleu"] = corpus_bleu(paired.pred, paired.gold, tokenizer=bleu_tokenizer)
  result["num_pairs"] = len(paired.ids)
  result["num_missing"] = paired.num_missing
  result["num_extra_predictions"] = paired.num_extra
  return result
