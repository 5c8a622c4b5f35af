"""Extractive explanation baselines of Table 5: LEAD-3, ORACLE and the evidence itself.

All three read a claim's text evidence only (no generation, no label):

* `lead3`: the first three sentences of the evidence.
* `oracle`: the evidence sentences a greedy search picks to maximise ROUGE-2 F against the
  gold explanation (an upper bound for extractive explanations, as in summarisation).
* `evidence_only`: the whole evidence ("evidence without generation").

Evidence is a claim's snippets in order (`Claim.evidence`) or one string. Each snippet is
split into sentences with `mocheg_jax.data.text.split_sentences` and the lists are
concatenated: a snippet boundary is always a sentence boundary, so a snippet that ends
without punctuation (or with "Dr.") is never glued to the next one. Outputs join the chosen
sentences with single spaces; a claim without evidence gives "" (callers count these).

ORACLE computes ROUGE-2 itself, from bigram counters over rouge-score's own tokenizer
(lower case, alphanumeric tokens, Porter stems of tokens longer than 3 characters), so that
each sentence is tokenized once instead of re-scoring every candidate text with the
package. The figure equals rouge-score's ROUGE-2 F of the joined output, including the
bigrams that span two consecutive chosen sentences (they are in the joined text too); the
tests check both against `rouge_score`.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import functools
import types
from typing import Sequence

from nltk.stem import porter
from rouge_score import tokenize as rouge_tokenize

from mocheg_jax.data.text import split_sentences

LEAD_SENTENCES = 3

Bigram = tuple[str, str]

# rouge-score stems with nltk's PorterStemmer (default mode); memoised because stemming is
# most of the tokenizer's time and evidence words repeat across claims.
_STEMMER = types.SimpleNamespace(
    stem=functools.lru_cache(maxsize=1 << 18)(porter.PorterStemmer().stem))


def _check_text(text: object, what: str) -> str:
  if not isinstance(text, str):
    raise TypeError(f"{what} must be a str, got {type(text).__name__}: {text!r:.80}")
  return text


def evidence_sentences(evidence: str | Sequence[str]) -> list[str]:
  """The evidence's sentences in order: each snippet split by `split_sentences`.

  Args:
    evidence: one text, or a sequence of snippets (e.g. `Claim.evidence`).

  Raises:
    TypeError: evidence is neither a str nor a sequence of str (names the bad snippet).
  """
  if isinstance(evidence, str):
    return split_sentences(evidence)
  if not isinstance(evidence, Sequence):
    raise TypeError(f"evidence must be a str or a sequence of str, got "
                    f"{type(evidence).__name__}")
  sentences = []
  for i, snippet in enumerate(evidence):
    sentences.extend(split_sentences(_check_text(snippet, f"evidence snippet {i}")))
  return sentences


def lead3(evidence: str | Sequence[str]) -> str:
  """The first three sentences of the evidence ('' without evidence)."""
  return " ".join(evidence_sentences(evidence)[:LEAD_SENTENCES])


def evidence_only(evidence: str | Sequence[str]) -> str:
  """The evidence itself, sentences joined by single spaces ('' without evidence)."""
  return " ".join(evidence_sentences(evidence))


# ----- ROUGE-2 from counters -----

def rouge_tokens(text: str) -> list[str]:
  """rouge-score's tokens of `text` with stemming (what its RougeScorer compares)."""
  return rouge_tokenize.tokenize(_check_text(text, "text"), _STEMMER)


def bigram_counts(tokens: Sequence[str]) -> collections.Counter[Bigram]:
  return collections.Counter(zip(tokens, tokens[1:]))


def _fmeasure(overlap: int, n_pred: int, n_ref: int) -> float:
  # The same float operations as rouge_score.scoring.fmeasure on its precision and recall,
  # so figures match the package to the last bit.
  precision = overlap / max(n_pred, 1)
  recall = overlap / max(n_ref, 1)
  if precision + recall > 0:
    return 2 * precision * recall / (precision + recall)
  return 0.0


def rouge2_fmeasure(prediction: str, reference: str) -> float:
  """ROUGE-2 F of a prediction against a reference, as rouge-score's RougeScorer computes it."""
  pred = bigram_counts(rouge_tokens(prediction))
  ref = bigram_counts(rouge_tokens(reference))
  overlap = sum(min(c, pred[g]) for g, c in ref.items())
  return _fmeasure(overlap, sum(pred.values()), sum(ref.values()))


# ----- ORACLE -----

@dataclasses.dataclass(frozen=True)
class OracleSelection:
  """What the greedy ORACLE chose.

  Attributes:
    indices: positions of the chosen sentences in `evidence_sentences(evidence)`, ascending.
    sentences: the chosen sentences in document order.
    rouge2: ROUGE-2 F (fraction) of `text` against the reference.
  """
  indices: tuple[int, ...]
  sentences: tuple[str, ...]
  rouge2: float

  @property
  def text(self) -> str:
    return " ".join(self.sentences)


def _count_if_useful(changes: dict[Bigram, int], ref: collections.Counter[Bigram],
                     bigram: Bigram, delta: int) -> None:
  if bigram in ref:
    changes[bigram] = changes.get(bigram, 0) + delta


def oracle_selection(evidence: str | Sequence[str], reference: str,
                     max_sentences: int | None = None) -> OracleSelection:
  """Greedy extractive oracle: evidence sentences that maximise ROUGE-2 F to the reference.

  Each step adds the sentence whose addition (kept in document order) gives the highest
  ROUGE-2 F of the selection; ties go to the earlier sentence. The search stops when no
  sentence raises ROUGE-2 strictly, or after `max_sentences`. Greedy search is not exhaustive:
  a set it never reaches (e.g. the first three sentences) can score higher on some claims.

  Args:
    evidence: one text or a sequence of snippets.
    reference: the gold explanation.
    max_sentences: at most this many sentences (None: no limit).

  Returns:
    The selection; empty (rouge2 0) when there is no evidence or the reference has no bigram.
  """
  _check_text(reference, "reference")
  if max_sentences is not None and max_sentences < 1:
    raise ValueError(f"max_sentences must be positive or None, got {max_sentences}")
  sentences = evidence_sentences(evidence)
  ref = bigram_counts(rouge_tokens(reference))
  n_ref = sum(ref.values())
  if not sentences or not n_ref:
    return OracleSelection((), (), 0.0)
  tokens = [rouge_tokens(s) for s in sentences]
  # Per sentence, only the bigrams the reference holds can add overlap; the others only
  # add to the prediction's bigram count, which the token count already gives.
  useful = [[(g, c) for g, c in bigram_counts(t).items() if g in ref] for t in tokens]
  # A sentence without tokens changes nothing in the token sequence, so it cannot help.
  remaining = [i for i, t in enumerate(tokens) if t]

  selected: list[int] = []  # Ascending.
  held: collections.Counter[Bigram] = collections.Counter()  # Reference bigrams selected.
  overlap = n_pred = 0  # Clipped matches; bigrams of the selection's token sequence.
  limit = len(remaining) if max_sentences is None else max_sentences
  while remaining and len(selected) < limit:
    best = None  # (k, changes, overlap, n_pred)
    for k in remaining:
      changes = dict(useful[k])
      # Inserting k between its neighbours p < k < s in the selection replaces the bigram
      # (last of p, first of s) by (last of p, first of k) and (last of k, first of s).
      pos = bisect.bisect_left(selected, k)
      p = selected[pos - 1] if pos > 0 else None
      s = selected[pos] if pos < len(selected) else None
      if p is not None:
        _count_if_useful(changes, ref, (tokens[p][-1], tokens[k][0]), 1)
      if s is not None:
        _count_if_useful(changes, ref, (tokens[k][-1], tokens[s][0]), 1)
        if p is not None:
          _count_if_useful(changes, ref, (tokens[p][-1], tokens[s][0]), -1)
      new_overlap = overlap + sum(min(held[g] + d, ref[g]) - min(held[g], ref[g])
                                  for g, d in changes.items())
      new_pred = n_pred + len(tokens[k]) - (0 if selected else 1)
      # F = 2 * overlap / (n_pred + n_ref) exactly; compare fractions in integers so that
      # ties are exact and go to the earlier sentence (candidates run in document order).
      if best is None or new_overlap * (best[3] + n_ref) > best[2] * (new_pred + n_ref):
        best = (k, changes, new_overlap, new_pred)
    k, changes, new_overlap, new_pred = best
    if new_overlap * (n_pred + n_ref) <= overlap * (new_pred + n_ref):
      break  # No sentence raises ROUGE-2.
    held.update(changes)
    overlap, n_pred = new_overlap, new_pred
    bisect.insort(selected, k)
    remaining.remove(k)
  return OracleSelection(tuple(selected), tuple(sentences[i] for i in selected),
                         _fmeasure(overlap, n_pred, n_ref))


def oracle(evidence: str | Sequence[str], reference: str,
           max_sentences: int | None = None) -> str:
  """The greedy ROUGE-2 oracle's sentences joined by spaces (see `oracle_selection`)."""
  return oracle_selection(evidence, reference, max_sentences).text
