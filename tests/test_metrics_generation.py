"""Generation metrics against rouge-score, nltk BLEU and hand computations."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from nltk.translate import bleu_score as nltk_bleu
from rouge_score import rouge_scorer

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.metrics import generation as gm

WORDS = ("the claim was false because officials said photo shows a rally in 2016 "
         "cats dogs running ran sources confirmed viral post").split()


def _random_texts(seed: int, n: int, min_words: int = 4):
  rng = np.random.default_rng(seed)
  texts = []
  for _ in range(n):
    sentences = []
    for _ in range(int(rng.integers(1, 4))):
      words = list(rng.choice(WORDS, int(rng.integers(min_words, 15))))
      sentences.append(" ".join(words).capitalize() + ".")
    texts.append(" ".join(sentences))
  return texts


def test_rouge_matches_rouge_score_on_newline_joined_sentences():
  predictions = _random_texts(0, 30)
  references = _random_texts(1, 30)
  got = gm.rouge_scores(predictions, references)
  scorer = rouge_scorer.RougeScorer(list(gm.ROUGE_TYPES), use_stemmer=True)
  expected = {name: 0.0 for name in gm.ROUGE_TYPES}
  for p, r in zip(predictions, references):
    # Our sentence splitter on these texts splits exactly at ". " (checked below).
    scores = scorer.score(r.replace(". ", ".\n"), p.replace(". ", ".\n"))
    for name in gm.ROUGE_TYPES:
      expected[name] += scores[name].fmeasure / len(predictions)
  assert gm.sentences_per_line(predictions[0]) == predictions[0].replace(". ", ".\n")
  for name in gm.ROUGE_TYPES:
    assert got[name] == pytest.approx(expected[name], abs=1e-12), name
  assert 0 < got["rouge2"] < got["rouge1"] < 1


def test_rouge_lsum_uses_sentence_boundaries():
  # The same words in a different sentence order: rougeL (one LCS over the whole text)
  # drops, rougeLsum (union LCS per reference sentence) stays perfect.
  reference = "Officials said the photo was fake. The rally happened in 2016."
  prediction = "The rally happened in 2016. Officials said the photo was fake."
  got = gm.rouge_scores([prediction], [reference])
  assert got["rougeLsum"] == pytest.approx(1.0)
  assert got["rougeL"] < 0.7
  assert got["rouge1"] == pytest.approx(1.0)


def test_rouge_stems_and_ignores_case():
  got = gm.rouge_scores(["Cats Running"], ["cat runs"])
  assert got["rouge1"] == pytest.approx(1.0)


def _nltk_corpus_bleu(hyps, refs):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # nltk warns when an n-gram order has no match.
    return nltk_bleu.corpus_bleu([[r] for r in refs], hyps)


@pytest.mark.parametrize("tokenizer", ["whitespace", "13a"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bleu_matches_nltk_on_the_same_tokens(seed, tokenizer):
  # Every hypothesis has >= 4 tokens, where nltk and the standard definition agree.
  predictions = _random_texts(seed, 40)
  references = [p if i % 3 == 0 else r
                for i, (p, r) in enumerate(zip(predictions, _random_texts(seed + 10, 40)))]
  tokenize = gm.BLEU_TOKENIZERS[tokenizer]
  expected = _nltk_corpus_bleu([tokenize(p) for p in predictions],
                               [tokenize(r) for r in references])
  got = gm.corpus_bleu(predictions, references, tokenizer=tokenizer)
  assert got == pytest.approx(expected, abs=1e-12)
  assert 0.1 < got < 1


def test_bleu_brevity_penalty_and_hand_case():
  hyp = "a b c d e f".split()
  ref = "a b c d e f g h".split()
  stats = gm.corpus_bleu_tokens([hyp], [ref])
  assert stats.precisions == (1.0, 1.0, 1.0, 1.0)
  assert stats.brevity_penalty == pytest.approx(math.exp(1 - 8 / 6))
  assert stats.bleu == pytest.approx(math.exp(1 - 8 / 6))
  # Clipping: "the the the the" against "the cat" matches one unigram of four.
  stats = gm.corpus_bleu_tokens([["the"] * 4], [["the", "cat"]])
  assert stats.precisions[0] == pytest.approx(1 / 4)
  assert stats.bleu == 0.0  # No bigram matches and no smoothing.
  # Perfect corpus.
  assert gm.corpus_bleu(["x y z w v"], ["x y z w v"]) == pytest.approx(1.0)


def test_bleu_short_hypotheses_add_no_possible_ngrams():
  # A 2-token hypothesis contributes 0 possible 3- and 4-grams (nltk would add 1 each).
  stats = gm.corpus_bleu_tokens([["a", "b"], "c d e f g".split()],
                                [["a", "b"], "c d e f g".split()])
  assert stats.precisions == (1.0, 1.0, 1.0, 1.0)
  assert stats.bleu == pytest.approx(1.0)
  assert gm.corpus_bleu_tokens([[]], [["a"]]).bleu == 0.0


def test_tokenizers():
  assert gm.tokenize_whitespace(" It's  $4.20, \"fake\".\n") == ["It's", "$4.20,", "\"fake\"."]
  assert gm.tokenize_13a("It's $4.20, \"fake\". 3-4 1,000 people. &amp; A/B") == [
      "It's", "$", "4.20", ",", '"', "fake", '"', ".", "3", "-", "4", "1,000", "people",
      ".", "&", "A", "/", "B"]
  with pytest.raises(ValueError, match="unknown BLEU tokenizer"):
    gm.corpus_bleu(["a"], ["a"], tokenizer="moses")


class FakeEmbedder:
  """Each word -> a fixed vector; records the calls."""

  def __init__(self, table):
    self.table = table
    self.calls = []

  def __call__(self, texts):
    self.calls.append(list(texts))
    return [np.array([self.table[w] for w in t.split()], dtype=np.float32).reshape(-1, 2)
            for t in texts]


def test_bert_score_hand_computed():
  table = {"a": [1, 0], "b": [0, 1], "c": [1, 1], "d": [-1, 0]}
  embed = FakeEmbedder(table)
  got = gm.bert_score(["a c", "d", ""], ["a b", "a", "a"], embed, batch_size=2)
  s = 1 / math.sqrt(2)
  # Pair 0: C = [[1, 0], [s, s]] -> P = mean(1, s), R = mean(1, s).
  p0 = r0 = (1 + s) / 2
  f0 = 2 * p0 * r0 / (p0 + r0)
  # Pair 1: C = [[-1]] -> P = R = -1, F = -1. Pair 2: empty candidate -> 0.
  assert got["precision"] == pytest.approx((p0 - 1 + 0) / 3)
  assert got["recall"] == pytest.approx((r0 - 1 + 0) / 3)
  assert got["f1"] == pytest.approx((f0 - 1 + 0) / 3)
  assert embed.calls == [["a c", "d", "a b", "a"], ["", "a"]]  # Batches of 2 pairs.


def test_bert_score_asymmetric_and_errors():
  table = {"a": [1, 0], "b": [0, 1]}
  got = gm.bert_score(["a"], ["a b"], FakeEmbedder(table))
  assert got["precision"] == pytest.approx(1.0)
  assert got["recall"] == pytest.approx(0.5)
  assert got["f1"] == pytest.approx(2 / 3)
  with pytest.raises(ValueError, match="returned 1 arrays"):
    gm.bert_score(["a"], ["a"], lambda texts: [np.ones((1, 2))])
  with pytest.raises(ValueError, match="2 predictions but 1"):
    gm.bert_score(["a", "b"], ["a"], FakeEmbedder(table))


def test_text_files(tmp_path):
  refs = tmp_path / "refs.csv"
  refs.write_text('claim_id,explanation\n1,"The photo is fake. It was edited."\n'
                  "2,The claim is true.\n", encoding="utf-8")
  preds = tmp_path / "preds.csv"
  preds.write_text('claim_id,explanation\n2,The claim is true.\n'
                   '1,"The photo is fake. It was edited."\n', encoding="utf-8")
  got = gm.evaluate_text_files(refs, preds)
  for name in (*gm.ROUGE_TYPES, "bleu"):
    assert got[name] == pytest.approx(1.0), name
  assert got["num_pairs"] == 2 and got["num_missing"] == 0
  partial = tmp_path / "partial.csv"
  partial.write_text("claim_id,explanation\n2,The claim is true.\n", encoding="utf-8")
  with pytest.raises(MochegInputError, match=r"1 of 2 claims .*claim_id 1\)"):
    gm.evaluate_text_files(refs, partial)
  got = gm.evaluate_text_files(refs, partial, allow_missing=True)
  assert got["rouge1"] == pytest.approx(0.5) and got["num_missing"] == 1
