"""Table 5: explanation generation scores per system, evidence source and label source.

`score_explanations` pairs predicted and gold explanations by claim id and scores them with
`mocheg_jax.metrics.generation` (ROUGE-1/2/L/Lsum F with stemming on sentence-per-line
texts, corpus BLEU-4, and BERTScore F1 when a token embedder is given). Nothing is dropped
silently: a claim without a gold explanation is skipped and counted, a claim without a
prediction is scored as an empty text and counted, and a prediction for a claim that is not
among the references is an error. `baseline_rows` adds the extractive baselines (LEAD-3,
ORACLE, the evidence itself) on a split's gold evidence; `format_table` and `write_table`
print and save the table in the style of Table 4 (verification/stage.py).
"""

from __future__ import annotations

import json
import os
from typing import Callable, Mapping, Protocol, Sequence

import numpy as np

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.explanation import baselines
from mocheg_jax.metrics import generation
from mocheg_jax.metrics import keyed_csv
from mocheg_jax.utils import files

LEAD3, ORACLE, EVIDENCE = "LEAD-3", "ORACLE", "Evidence (no generation)"
BASELINES: tuple[str, ...] = (LEAD3, ORACLE, EVIDENCE)
NO_LABEL = "-"  # The Label column of systems that do not read a label.
TABLE_MD, TABLE_JSON = "table5.md", "table5.json"

# texts -> one [T_i, D] array of token embeddings per text (see generation.bert_score).
TokenEmbedder = Callable[[list[str]], Sequence[np.ndarray]]


class ExplainedClaim(Protocol):
  """What the baselines read of a claim (`mocheg_jax.data.mocheg.Claim` has it)."""
  claim_id: int
  evidence: Sequence[str]
  explanation: str


def _keyed(texts: Mapping, name: str) -> dict[str, str]:
  """Texts keyed by normalised claim id ('12', 12 and '12.0' are one claim)."""
  keyed: dict[str, str] = {}
  for raw_id, text in texts.items():
    key = keyed_csv.normalize_claim_id(str(raw_id))
    if not isinstance(text, str):
      raise TypeError(f"{name}: the text of claim_id {raw_id!r} must be a str, got "
                      f"{type(text).__name__}: {text!r:.80}")
    if key in keyed:
      raise MochegInputError(f"{name}: claim_id {raw_id!r} appears twice (as {key!r})")
    keyed[key] = text
  return keyed


def score_explanations(predictions: Mapping, references: Mapping, *,
                       bert_encoder: TokenEmbedder | None = None,
                       bleu_tokenizer: str = "whitespace",
                       predictions_name: str = "predictions",
                       references_name: str = "references") -> dict:
  """Scores predicted explanations against gold ones, paired by claim id.

  Args:
    predictions: claim id -> generated explanation.
    references: claim id -> gold explanation ('' or blank: the claim has none). Its order
      is the scoring order.
    bert_encoder: token embedder for BERTScore (`generation.bert_score`'s `embed_tokens`);
      None leaves BERTScore out.
    bleu_tokenizer: a key of `generation.BLEU_TOKENIZERS`.
    predictions_name, references_name: how messages name the two sources.

  Returns:
    `rouge1 rouge2 rougeL rougeLsum bleu` (fractions), with an encoder also `bertscore`
    (F1), `bertscore_precision` and `bertscore_recall`; and the counts `num_scored`,
    `num_missing_prediction` (scored as ''), `num_empty_prediction` (given but blank) and
    `num_no_reference` (skipped).

  Raises:
    MochegInputError: a prediction for a claim id not among the references (named), a
      duplicate claim id, or no claim with a gold explanation.
    TypeError: a text that is not a str (names the claim id).
  """
  refs = _keyed(references, references_name)
  preds = _keyed(predictions, predictions_name)
  unknown = [k for k in preds if k not in refs]
  if unknown:
    shown = ", ".join(map(repr, unknown[:keyed_csv.MAX_IDS_IN_MESSAGE]))
    more = ", ..." if len(unknown) > keyed_csv.MAX_IDS_IN_MESSAGE else ""
    raise MochegInputError(
        f"{predictions_name}: {len(unknown)} prediction(s) for claim_id(s) not in "
        f"{references_name}: {shown}{more}")
  ids = [k for k, text in refs.items() if text.strip()]
  if not ids:
    raise MochegInputError(f"{references_name}: none of its {len(refs)} claims has a gold "
                           f"explanation to score against")
  gold = [refs[k] for k in ids]
  pred = [preds.get(k, "") for k in ids]
  result: dict = generation.rouge_scores(pred, gold)
  result["bleu"] = generation.corpus_bleu(pred, gold, tokenizer=bleu_tokenizer)
  if bert_encoder is not None:
    bert = generation.bert_score(pred, gold, bert_encoder)
    result.update(bertscore=bert["f1"], bertscore_precision=bert["precision"],
                  bertscore_recall=bert["recall"])
  result.update(
      num_scored=len(ids),
      num_missing_prediction=sum(1 for k in ids if k not in preds),
      num_empty_prediction=sum(1 for k in ids if k in preds and not preds[k].strip()),
      num_no_reference=len(refs) - len(ids))
  return result


def score_row(system: str, evidence: str, label: str, predictions: Mapping,
              references: Mapping, **kwargs) -> dict:
  """One Table 5 row: {system, evidence, label, metrics and counts of score_explanations}.

  Args:
    system: e.g. "BART + REINFORCE" or "LEAD-3".
    evidence: the evidence source ("gold", "system").
    label: the label source ("gold", "system", or NO_LABEL).
    predictions, references, **kwargs: as `score_explanations`.
  """
  return {"system": system, "evidence": evidence, "label": label,
          **score_explanations(predictions, references, **kwargs)}


def baseline_rows(claims: Sequence[ExplainedClaim], *, evidence: str = "gold",
                  systems: Sequence[str] = BASELINES,
                  max_oracle_sentences: int | None = None,
                  bert_encoder: TokenEmbedder | None = None,
                  bleu_tokenizer: str = "whitespace") -> list[dict]:
  """Table 5 rows of the extractive baselines over a split's claims.

  Args:
    claims: the split's claims (`MochegRelease.claims(split)`); their `evidence` is the
      evidence the baselines read and their `explanation` the reference.
    evidence: the name of that evidence source in the table.
    systems: which of `BASELINES` to score, in this order.
    max_oracle_sentences: ORACLE's sentence limit (None: until ROUGE-2 stops rising).
    bert_encoder, bleu_tokenizer: as `score_explanations`.

  Returns:
    One row per system, with `num_no_evidence`: scored claims whose evidence is empty
    (their prediction is '' and counts in `num_empty_prediction`).

  Raises:
    MochegInputError: two claims with one id, or no claim with a gold explanation.
  """
  unknown = [s for s in systems if s not in BASELINES]
  if unknown:
    raise ValueError(f"unknown baseline(s) {unknown}; expected some of {BASELINES}")
  references = {c.claim_id: c.explanation for c in claims}
  if len(references) != len(claims):
    raise MochegInputError(f"{len(claims) - len(references)} duplicate claim id(s) among "
                           f"the {len(claims)} claims")
  # ORACLE needs a reference; claims without one are skipped in scoring anyway.
  scored = [c for c in claims if isinstance(c.explanation, str) and c.explanation.strip()]
  no_evidence = sum(1 for c in scored if not baselines.evidence_sentences(c.evidence))
  make = {
      LEAD3: lambda c: baselines.lead3(c.evidence),
      ORACLE: lambda c: baselines.oracle(c.evidence, c.explanation, max_oracle_sentences),
      EVIDENCE: lambda c: baselines.evidence_only(c.evidence),
  }
  rows = []
  for system in systems:
    predictions = {c.claim_id: make[system](c) for c in scored}
    row = score_row(system, evidence, NO_LABEL, predictions, references,
                    bert_encoder=bert_encoder, bleu_tokenizer=bleu_tokenizer)
    row["num_no_evidence"] = no_evidence
    rows.append(row)
  return rows


def _pct(value: float | None) -> str:
  return "-" if value is None else f"{100 * value:.2f}"


def format_table(rows: Sequence[dict]) -> str:
  """Table 5 in markdown (percent, 2 decimals, '-' when absent), then the claim counts."""
  header = ["System", "Evidence", "Label", "ROUGE-1", "ROUGE-2", "ROUGE-L", "BLEU",
            "BERTScore"]
  lines = ["| " + " | ".join(header) + " |",
           "|---|---|---|" + "---:|" * (len(header) - 3)]
  for r in rows:
    cells = [r["system"], r["evidence"], r["label"],
             *(_pct(r.get(k)) for k in ("rouge1", "rouge2", "rougeL", "bleu", "bertscore"))]
    lines.append("| " + " | ".join(cells) + " |")
  lines.append("\nClaims (scored / without prediction / empty prediction / without gold "
               "explanation):")
  for r in rows:
    counts = " / ".join(str(r.get(k, "-")) for k in (
        "num_scored", "num_missing_prediction", "num_empty_prediction", "num_no_reference"))
    lines.append(f"- {r['system']}, {r['evidence']}, {r['label']}: {counts}")
  return "\n".join(lines)


def write_table(rows: Sequence[dict], out_dir: str | os.PathLike) -> tuple[str, str]:
  """Writes OUT_DIR/table5.md and OUT_DIR/table5.json atomically; returns their paths."""
  out_dir = os.fspath(out_dir)
  os.makedirs(out_dir, exist_ok=True)
  md_path, json_path = os.path.join(out_dir, TABLE_MD), os.path.join(out_dir, TABLE_JSON)
  files.write_text(json_path, json.dumps(list(rows), indent=2) + "\n")
  files.write_text(md_path, format_table(rows) + "\n")
  return md_path, json_path
