"""The retrieval stage's output, read by verification and explanation as "system evidence".

Two forms are written:
* a TREC run per modality (`metrics.trec.write_run` / `read_run`), what the metrics score;
* one Mocheg-style CSV with a row per claim of the split and the columns
  `claim_id, text_evidence_ids, text_evidence, text_scores, image_evidence, image_scores`.
  Every list cell is a JSON array, ranked best first: sentence ids, sentence texts (JSON
  strings, so commas, quotes and newlines inside a sentence are safe; every control
  character and Unicode line separator is escaped, so each row is one line), scores, image
  file names, image scores.
  A claim without image retrieval has `[]` image cells; an empty cell reads as `[]` too.

Reading validates everything a later stage relies on and names the file, the row and the
column of the first problem (`MochegInputError`): the header, integer claim ids, JSON lists
of the right element type, equal lengths of ids/texts/scores, finite scores ranked best
first, and claim ids that occur once.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
from typing import Iterable, Mapping, Sequence

from mocheg_jax.data import csv_io
from mocheg_jax.data.report import MochegInputError

COLUMNS = ("claim_id", "text_evidence_ids", "text_evidence", "text_scores", "image_evidence",
           "image_scores")

Run = dict[str, list[tuple[str, float]]]


@dataclasses.dataclass(frozen=True)
class RetrievedEvidence:
  """One claim's retrieved evidence, best first."""
  claim_id: int
  text_ids: tuple[str, ...] = ()       # KB sentence `corpus_id`s
  texts: tuple[str, ...] = ()          # the sentences, parallel to text_ids
  text_scores: tuple[float, ...] = ()
  images: tuple[str, ...] = ()         # KB image file names
  image_scores: tuple[float, ...] = ()

  def __post_init__(self) -> None:
    if not len(self.text_ids) == len(self.texts) == len(self.text_scores):
      raise ValueError(
          f"claim {self.claim_id}: {len(self.text_ids)} text ids, {len(self.texts)} texts "
          f"and {len(self.text_scores)} text scores; they must be parallel lists")
    if len(self.images) != len(self.image_scores):
      raise ValueError(f"claim {self.claim_id}: {len(self.images)} images but "
                       f"{len(self.image_scores)} image scores")


def _check_ranked(scores: Sequence[float]) -> str | None:
  """Why `scores` are not finite and non-increasing, or None if they are."""
  previous = math.inf
  for i, score in enumerate(scores):
    if not math.isfinite(score):
      return f"score {score!r} at position {i} is not a finite number"
    if score > previous:
      return (f"score {score!r} at position {i} is higher than {previous!r} before it; "
              "lists must be ranked best first")
    previous = score
  return None


# Characters JSON leaves raw (it escapes only those below U+0020) that some line splitters
# (Python's str.splitlines, editors) treat as line breaks; escaped, so a row is one line.
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028",
                              "\u2029": "\\u2029"})


def _cell(values: Iterable) -> str:
  return json.dumps(list(values), ensure_ascii=False, allow_nan=False).translate(_LINE_BREAKS)


def write_results(path: str | os.PathLike, rows: Iterable[RetrievedEvidence]) -> int:
  """Writes the retrieval result CSV, rows in the order given; returns the row count.

  Raises:
    ValueError: a claim id occurs twice, or scores are not finite or not ranked best first.
  """
  path_str = os.fspath(path)
  seen: set[int] = set()
  count = 0
  os.makedirs(os.path.dirname(path_str) or ".", exist_ok=True)
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.writer(f, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows:
      if row.claim_id in seen:
        raise ValueError(f"{path_str}: claim {row.claim_id} is written twice")
      seen.add(row.claim_id)
      for what, scores in (("text", row.text_scores), ("image", row.image_scores)):
        problem = _check_ranked([float(s) for s in scores])
        if problem:
          raise ValueError(f"{path_str}: claim {row.claim_id} {what}: {problem}")

      writer.writerow((
          int(row.claim_id), _cell(map(str, row.text_ids)), _cell(map(str, row.texts)),
          _cell(float(s) for s in row.text_scores), _cell(map(str, row.images)),
          _cell(float(s) for s in row.image_scores)))
      count += 1
  return count


def _parse_list(cell: str, column: str, where: str, kind: type) -> list:
  """A JSON array cell of `kind` items (str, or numbers for float); '' is []."""
  if not cell.strip():
    return []
  try:
    value = json.loads(cell)
  except json.JSONDecodeError as e:
    raise MochegInputError(f"{where}, column {column}: not valid JSON ({e.msg} at character "
                           f"{e.pos}): {cell[:80]!r}") from None
  if not isinstance(value, list):
    raise MochegInputError(
        f"{where}, column {column}: expected a JSON array, found {type(value).__name__}")
  for i, item in enumerate(value):
    if kind is str:
      ok = isinstance(item, str)
    else:  # bool is an int subclass but never a score.
      ok = isinstance(item, (int, float)) and not isinstance(item, bool)
    if not ok:
      expected = "a string" if kind is str else "a number"
      raise MochegInputError(
          f"{where}, column {column}: item {i} is {item!r}, expected {expected}")
  return [float(v) for v in value] if kind is float else value


def read_results(path: str | os.PathLike) -> dict[int, RetrievedEvidence]:
  """Reads a retrieval result CSV; claim id -> its evidence, in file order.

  Extra columns are ignored (a later tool may add some); missing ones are an error.

  Raises:
    MochegInputError: missing file or column, or a bad row (named by file, row and column).
  """
  path_str = os.fspath(path)
  try:
    f = open(path, newline="", encoding="utf-8-sig")
  except FileNotFoundError:
    raise MochegInputError(f"{path_str}: missing retrieval result file") from None
  except IsADirectoryError:
    raise MochegInputError(f"{path_str}: is a directory, expected a retrieval result CSV") \
        from None
  results: dict[int, RetrievedEvidence] = {}
  with f:
    for where, claim_id, cells in csv_io.claim_rows(f, path_str, COLUMNS):
      text_ids = _parse_list(cells["text_evidence_ids"], "text_evidence_ids", where, str)
      texts = _parse_list(cells["text_evidence"], "text_evidence", where, str)
      text_scores = _parse_list(cells["text_scores"], "text_scores", where, float)
      images = _parse_list(cells["image_evidence"], "image_evidence", where, str)
      image_scores = _parse_list(cells["image_scores"], "image_scores", where, float)
      if not len(text_ids) == len(texts) == len(text_scores):
        raise MochegInputError(
            f"{where}, columns text_evidence_ids/text_evidence/text_scores: lengths "
            f"{len(text_ids)}/{len(texts)}/{len(text_scores)} differ")
      if len(images) != len(image_scores):
        raise MochegInputError(f"{where}, columns image_evidence/image_scores: lengths "
                               f"{len(images)}/{len(image_scores)} differ")
      for column, scores in (("text_scores", text_scores), ("image_scores", image_scores)):
        problem = _check_ranked(scores)
        if problem:
          raise MochegInputError(f"{where}, column {column}: {problem}")
      results[claim_id] = RetrievedEvidence(claim_id, tuple(text_ids), tuple(texts),
                                            tuple(text_scores), tuple(images),
                                            tuple(image_scores))
  return results


def results_from_runs(claim_ids: Iterable[int], text_run: Mapping[str, Sequence] | None,
                      sentence_texts: Mapping[str, str] | None = None,
                      image_run: Mapping[str, Sequence] | None = None,
                      k: int | None = None) -> list[RetrievedEvidence]:
  """Assembles result rows (one per claim, in the order given) from per-modality runs.

  Args:
    claim_ids: the split's claims; a claim a run lacks gets empty lists for it.
    text_run: query id (str(claim_id)) -> ranked (corpus_id, score) pairs, or None.
    sentence_texts: corpus_id -> sentence text, needed with a text run.
    image_run: query id -> ranked (image file name, score) pairs, or None.
    k: keep the top k of each list (None: all).

  Raises:
    MochegInputError: a retrieved sentence id has no text (the run is not of this KB).
  """
  if text_run is not None and sentence_texts is None:
    raise ValueError("a text run needs sentence_texts to fill the text_evidence column")
  rows = []
  for claim_id in claim_ids:
    key = str(claim_id)
    texts_ranked = list(text_run.get(key, ()))[:k] if text_run is not None else []
    images_ranked = list(image_run.get(key, ()))[:k] if image_run is not None else []
    texts = []
    for doc, _ in texts_ranked:
      text = sentence_texts.get(doc)
      if text is None:
        raise MochegInputError(f"claim {claim_id}: retrieved sentence {doc!r} is not in the "
                               "knowledge base")
      texts.append(text)
    rows.append(RetrievedEvidence(
        int(claim_id), tuple(d for d, _ in texts_ranked), tuple(texts),
        tuple(float(s) for _, s in texts_ranked), tuple(d for d, _ in images_ranked),
        tuple(float(s) for _, s in images_ranked)))
  return rows


def text_run(results: Mapping[int, RetrievedEvidence]) -> Run:
  """The text part of results as a run (query id str(claim_id)), for the metrics."""
  return {str(c): list(zip(r.text_ids, r.text_scores)) for c, r in results.items()}


def image_run(results: Mapping[int, RetrievedEvidence]) -> Run:
  """The image part of results as a run (query id str(claim_id)), for the metrics."""
  return {str(c): list(zip(r.images, r.image_scores)) for c, r in results.items()}
