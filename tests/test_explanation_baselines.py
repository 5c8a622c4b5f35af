"""Explanation baselines (LEAD-3, ORACLE, evidence) and the Table 5 scorer."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from rouge_score import rouge_scorer

from mocheg_jax.data.mocheg import MochegRelease
from mocheg_jax.data.report import MochegInputError
from mocheg_jax.data.synthetic import write_world
from mocheg_jax.explanation import baselines
from mocheg_jax.explanation import table5
from mocheg_jax.metrics.generation import corpus_bleu, rouge_scores
from tests import release_fixture

FIVE = ("The bridge opened in 1901. It has three arches. Dr. Venn designed it. "
        "Critics praised it! Was it ever repaired?")
FIVE_SENTENCES = ["The bridge opened in 1901.", "It has three arches.", "Dr. Venn designed it.",
                  "Critics praised it!", "Was it ever repaired?"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  root = tmp_path_factory.mktemp("world")
  write_world(root, "tiny", seed=0, workers=0, progress=False)
  return MochegRelease(root)


def _rouge2(prediction: str, reference: str) -> float:
  scorer = rouge_scorer.RougeScorer(["rouge2"], use_stemmer=True)
  return scorer.score(reference, prediction)["rouge2"].fmeasure


def _brute_force_greedy(sentences, reference):
  """The greedy oracle re-scoring every candidate text with rouge-score itself."""
  selected, current = [], 0.0
  while len(selected) < len(sentences):
    best = None
    for k in range(len(sentences)):
      if k in selected:
        continue
      score = _rouge2(" ".join(sentences[i] for i in sorted(selected + [k])), reference)
      if best is None or score > best[1] + 1e-12:
        best = (k, score)
    if best[1] <= current + 1e-12:
      break
    selected.append(best[0])
    current = best[1]
  return tuple(sorted(selected)), current


# ---- LEAD-3 and evidence -------------------------------------------------------------------
def test_lead3_and_evidence_on_five_sentences():
  assert baselines.evidence_sentences(FIVE) == FIVE_SENTENCES
  assert baselines.lead3(FIVE) == ("The bridge opened in 1901. It has three arches. "
                                   "Dr. Venn designed it.")
  # Snippets: the third sentence is the first of the second snippet.
  snippets = ("The bridge opened in 1901. It has three arches.",
              "Dr. Venn designed it. Critics praised it!", "Was it ever repaired?")
  assert baselines.lead3(snippets) == baselines.lead3(FIVE)
  assert baselines.evidence_only(snippets) == " ".join(FIVE_SENTENCES)
  assert baselines.lead3("Only one sentence here.") == "Only one sentence here."


def test_snippet_boundary_is_a_sentence_boundary():
  # Joined, "...by Dr. Venn said so." would be one sentence; as snippets it is two.
  snippets = ("It was built by Dr.", "Venn said so. Then it fell. Later it rose. Now it stands.")
  assert baselines.evidence_sentences(snippets)[:2] == ["It was built by Dr.", "Venn said so."]
  assert baselines.lead3(snippets) == "It was built by Dr. Venn said so. Then it fell."


def test_empty_evidence_gives_empty_texts():
  for evidence in ((), "", ("", "  ")):
    assert baselines.lead3(evidence) == ""
    assert baselines.evidence_only(evidence) == ""
    assert baselines.oracle(evidence, "The cat sat on the mat.") == ""


def test_bad_evidence_types_are_named():
  with pytest.raises(TypeError, match="evidence snippet 1"):
    baselines.lead3(("fine.", None))
  with pytest.raises(TypeError, match="evidence must be"):
    baselines.lead3(42)
  with pytest.raises(TypeError, match="reference must be a str"):
    baselines.oracle("A sentence.", None)


# ---- ROUGE-2 from counters -----------------------------------------------------------------
@pytest.mark.parametrize("prediction,reference", [
    ("The cats were running quickly.", "A cat runs quickly, they said."),
    ("Rossall Bay was founded in 1604. It exports tin!", "Rossall Bay, founded 1604, exports tin."),
    ("Nothing alike at all.", "Completely different words here."),
    ("", "Some reference text."),
    ("Some prediction text.", "Word"),
    ("U.S. officials' claims (2019) were re-stated: 45% fell.",
     "US officials claim 45% fell in 2019."),
])
def test_rouge2_equals_rouge_score(prediction, reference):
  assert baselines.rouge2_fmeasure(prediction, reference) == _rouge2(prediction, reference)


# ---- ORACLE ---------------------------------------------------------------------------------
def test_oracle_known_greedy_choice_uses_the_junction_bigram():
  sentences = ["A dog ran far away.", "The cat sat on.", "The mat today."]
  reference = "The cat sat on the mat today."
  selection = baselines.oracle_selection(sentences, reference)
  # Step 1: "The cat sat on." (F 6/9) beats "The mat today." (F 4/8). Step 2: adding
  # "The mat today." completes every bigram, "on the" across the two sentences included.
  assert selection.indices == (1, 2)
  assert selection.text == "The cat sat on. The mat today."
  assert selection.rouge2 == 1.0 == _rouge2(selection.text, reference)
  assert baselines.oracle(sentences, reference, max_sentences=1) == "The cat sat on."


def test_oracle_stops_when_a_second_sentence_lowers_rouge2():
  reference = "The cat sat on the mat and the dog barked loudly."
  first = "The cat sat on the mat."
  second = ("The dog barked at the postman and the neighbours and then everyone went home "
            "for a long time.")
  # The construction: the second sentence adds matches but lowers F.
  assert _rouge2(second, reference) < _rouge2(first, reference)
  assert _rouge2(f"{first} {second}", reference) < _rouge2(first, reference)
  selection = baselines.oracle_selection([second, first], reference)
  assert selection.indices == (1,)
  assert selection.text == first
  assert selection.rouge2 == pytest.approx(2 * 5 / (5 + 10))


def test_oracle_ties_go_to_the_earlier_sentence():
  reference = "The cat sat on the mat."
  selection = baselines.oracle_selection(["The cat sat.", "Mat on the.", "The cat sat."],
                                         reference)
  assert selection.indices[0] == 0  # Sentences 0 and 2 tie on every step.
  assert 2 not in selection.indices
  assert baselines.oracle(["x y z."], "") == ""  # No reference bigram: nothing raises ROUGE-2.
  with pytest.raises(ValueError, match="max_sentences"):
    baselines.oracle("A b.", "A b.", max_sentences=0)


def test_oracle_matches_brute_force_greedy_with_rouge_score(world):
  claims = world.claims("train")[:40]
  checked = 0
  for i, claim in enumerate(claims):
    # The claim's own evidence among two other claims' evidence: more sentences to choose.
    evidence = (*claims[i - 1].evidence, *claim.evidence, *claims[i - 2].evidence)
    sentences = baselines.evidence_sentences(evidence)
    selection = baselines.oracle_selection(evidence, claim.explanation)
    indices, score = _brute_force_greedy(sentences, claim.explanation)
    assert selection.indices == indices, claim.claim_id
    assert selection.rouge2 == pytest.approx(score, abs=1e-12)
    # What the Table 5 scorer reports for the output is what the oracle maximised.
    assert rouge_scores([selection.text], [claim.explanation])["rouge2"] == pytest.approx(
        selection.rouge2, abs=1e-12)
    checked += len(indices) > 1
  assert checked >= 10  # Multi-sentence selections (junction bigrams) were exercised.


def test_oracle_matches_brute_force_on_random_small_vocabulary_texts():
  # Six words make bigrams across sentence junctions match the reference often, so every
  # junction update of the incremental count (added on both sides, removed between the
  # neighbours of an inserted sentence) is exercised.
  rng = np.random.default_rng(0)
  words = ["red", "blue", "cat", "dogs", "sun", "moon"]
  text = lambda n: " ".join(rng.choice(words, n)).capitalize() + "."
  for _ in range(150):
    sentences = [text(rng.integers(1, 6)) for _ in range(rng.integers(2, 8))]
    reference = " ".join(text(rng.integers(2, 8)) for _ in range(3))
    selection = baselines.oracle_selection(sentences, reference)
    indices, score = _brute_force_greedy(sentences, reference)
    assert selection.indices == indices, (sentences, reference)
    assert selection.rouge2 == pytest.approx(score, abs=1e-12)


# ---- Table 5 scorer -------------------------------------------------------------------------
REFERENCES = {1: "The bridge has three arches.", 2: "The photo shows another bridge.",
              3: "", 4: "It was built in 1901."}


def test_score_explanations_counts_and_pairs():
  predictions = {"1": "The bridge has three arches.", 2.0: "", 3: "Ignored: no gold."}
  result = table5.score_explanations(predictions, REFERENCES)
  assert (result["num_scored"], result["num_missing_prediction"],
          result["num_empty_prediction"], result["num_no_reference"]) == (3, 1, 1, 1)
  gold = [REFERENCES[1], REFERENCES[2], REFERENCES[4]]
  pred = ["The bridge has three arches.", "", ""]
  expected = rouge_scores(pred, gold)
  for name in ("rouge1", "rouge2", "rougeL", "rougeLsum"):
    assert result[name] == pytest.approx(expected[name])
  assert result["rouge1"] == pytest.approx(1 / 3)  # One perfect pair of three.
  assert result["bleu"] == pytest.approx(corpus_bleu(pred, gold))
  assert "bertscore" not in result


def test_score_explanations_bad_input():
  with pytest.raises(MochegInputError, match=r"claim_id\(s\) not in references: '7'"):
    table5.score_explanations({7: "x", 1: "y"}, REFERENCES)
  with pytest.raises(TypeError, match="claim_id 2 must be a str, got float"):
    table5.score_explanations({2: float("nan")}, REFERENCES)
  with pytest.raises(MochegInputError, match="appears twice"):
    table5.score_explanations({1: "a", "1": "b"}, REFERENCES)
  with pytest.raises(MochegInputError, match="none of its 1 claims has a gold explanation"):
    table5.score_explanations({}, {3: " "})


def _letter_embedder(texts):
  """BERTScore 'tokens': one one-hot vector per letter."""
  eye = np.eye(26)
  return [eye[[ord(ch) - 97 for ch in t.lower() if "a" <= ch <= "z"]].reshape(-1, 26)
          for t in texts]


def test_bertscore_row_and_table_snapshot():
  rows = [table5.score_row("BART", "gold", "gold", {1: REFERENCES[1], 2: "x"}, REFERENCES,
                           bert_encoder=_letter_embedder),
          {"system": "LEAD-3", "evidence": "gold", "label": "-", "rouge1": 0.321,
           "rouge2": 0.16974, "rougeL": 0.22166, "bleu": 0.0, "num_scored": 2442,
           "num_missing_prediction": 0, "num_empty_prediction": 3, "num_no_reference": 5}]
  assert 0.0 < rows[0]["bertscore"] < 1.0  # Claim 4 has no prediction: scored 0.
  assert rows[0]["num_missing_prediction"] == 1
  table = table5.format_table(rows)
  assert table.splitlines()[3] == "| LEAD-3 | gold | - | 32.10 | 16.97 | 22.17 | 0.00 | - |"
  assert table.splitlines()[:2] == [
      "| System | Evidence | Label | ROUGE-1 | ROUGE-2 | ROUGE-L | BLEU | BERTScore |",
      "|---|---|---|---:|---:|---:|---:|---:|"]
  assert table.splitlines()[-1] == "- LEAD-3, gold, -: 2442 / 0 / 3 / 5"
  assert f"| {100 * rows[0]['bertscore']:.2f} |" in table.splitlines()[2]


def test_write_table_is_complete_and_leaves_no_temporary_file(tmp_path):
  rows = [{"system": "ORACLE", "evidence": "gold", "label": "-", "rouge1": 0.5,
           "rouge2": 0.25, "rougeL": 0.4, "bleu": 0.1, "num_scored": 1,
           "num_missing_prediction": 0, "num_empty_prediction": 0, "num_no_reference": 0}]
  out = tmp_path / "new" / "dir"
  md, js = table5.write_table(rows, out)
  assert sorted(os.listdir(out)) == ["table5.json", "table5.md"]
  assert json.loads(open(js).read()) == rows
  assert open(md).read() == table5.format_table(rows) + "\n"


# ---- Baseline rows --------------------------------------------------------------------------
def test_baseline_rows_on_the_hand_written_release(tmp_path):
  release_fixture.write_release(str(tmp_path))
  claims = MochegRelease(tmp_path).claims("train")  # Claims 1, 2 and 4 (no evidence).
  rows = table5.baseline_rows(claims)
  assert [r["system"] for r in rows] == list(table5.BASELINES)
  # ORACLE is also empty for claim 2: no evidence bigram is in its explanation.
  assert [(r["num_scored"], r["num_no_evidence"], r["num_empty_prediction"]) for r in rows] == [
      (3, 1, 1), (3, 1, 2), (3, 1, 1)]
  assert rows[2]["rouge1"] > 0  # "It has three arches." vs "The bridge indeed has three..."
  with pytest.raises(MochegInputError, match="duplicate claim id"):
    table5.baseline_rows([claims[0], claims[0]])


def test_oracle_beats_lead3_on_the_tiny_world(world):
  claims = world.claims("test")
  rows = {r["system"]: r for r in table5.baseline_rows(claims)}
  lead, oracle = rows[table5.LEAD3], rows[table5.ORACLE]
  assert oracle["rouge2"] >= lead["rouge2"] > 0
  assert oracle["num_scored"] == len([c for c in claims if c.explanation.strip()])
  # The row's ROUGE-2 is the mean of what the oracle maximised per claim.
  per_claim = [baselines.oracle_selection(c.evidence, c.explanation).rouge2 for c in claims
               if c.explanation.strip()]
  assert oracle["rouge2"] == pytest.approx(np.mean(per_claim), abs=1e-12)
