"""Relevance judgements (qrels) and ranked runs, read and written in the formats IR tools use.

Qrels come in two formats, detected from the first non-blank line:
* the Mocheg CSV (`TOPIC,ITERATION,DOCUMENT#,RELEVANCY`, possibly with extra columns such as
  the image qrels' `evidence_id`), read with the csv module because image file names may
  contain commas;
* plain TREC qrels, one judgement per line: `topic iteration doc relevancy`, no header.

Runs use the TREC format `qid Q0 docid rank score tag`, one retrieved document per line.

Ids are kept as strings (`281`, `281-1920-3`, `00281-01920-01-.jpg`). A malformed line or row
is a `MochegInputError` naming the file and the line/row: a run or qrels file that is partly
wrong cannot be scored honestly, so nothing is skipped.
"""

from __future__ import annotations

import csv
import math
import os
import re
from typing import Mapping, Sequence

from mocheg_jax.data.report import MochegInputError

Qrels = dict[str, dict[str, int]]
Run = dict[str, list[tuple[str, float]]]

# Column names of the Mocheg CSV qrels; ITERATION is always 0 and not needed.
_CSV_TOPIC, _CSV_DOC, _CSV_REL = "TOPIC", "DOCUMENT#", "RELEVANCY"
_WHITESPACE = re.compile(r"\s")


def _open_text(path: str | os.PathLike, what: str):
  try:
    return open(path, newline="", encoding="utf-8-sig")  # -sig: tolerate a BOM.
  except FileNotFoundError:
    raise MochegInputError(f"{os.fspath(path)}: missing file ({what})") from None
  except IsADirectoryError:
    raise MochegInputError(f"{os.fspath(path)}: is a directory, expected a {what}") from None


def _parse_relevancy(text: str) -> int:
  """int() that also accepts integer-valued floats such as '1.0' (pandas output)."""
  text = text.strip()
  try:
    return int(text)
  except ValueError:
    value = float(text)  # ValueError propagates for non-numbers.
    if not value.is_integer():
      raise ValueError(f"{text!r} is not an integer") from None
    return int(value)


def _add_judgement(qrels: Qrels, topic: str, doc: str, rel: int) -> None:
  # A document can be judged twice for a topic (an image that matches two proof images in
  # img_evidence_qrels.csv); the higher judgement wins so that no relevant item is lost
  # (Mocheg qrels hold only 0 and 1).
  docs = qrels.setdefault(topic, {})
  docs[doc] = max(rel, docs.get(doc, rel))


def _read_csv_qrels(f, path: str) -> Qrels:
  reader = csv.reader(f)
  header: list[str] = []
  while not any(h.strip() for h in header):  # The caller saw a header, maybe after blanks.
    header = next(reader)
  header = [h.strip() for h in header]
  upper = [h.upper() for h in header]
  missing = [c for c in (_CSV_TOPIC, _CSV_DOC, _CSV_REL) if c not in upper]
  if missing:
    raise MochegInputError(
        f"{path}: CSV qrels header lacks column(s) {', '.join(missing)}; found {header}")
  i_topic, i_doc, i_rel = (upper.index(c) for c in (_CSV_TOPIC, _CSV_DOC, _CSV_REL))
  qrels: Qrels = {}
  for row_number, row in enumerate(reader, start=1):
    if not row or all(not v.strip() for v in row):
      continue  # Blank lines carry no judgement.
    where = f"{path}: row {row_number} (line {reader.line_num})"
    if len(row) != len(header):
      raise MochegInputError(f"{where}: expected {len(header)} fields, found {len(row)}")
    topic, doc = row[i_topic].strip(), row[i_doc].strip()
    if not topic or not doc:
      raise MochegInputError(f"{where}: empty {_CSV_TOPIC if not topic else _CSV_DOC}")
    try:
      rel = _parse_relevancy(row[i_rel])
    except ValueError:
      raise MochegInputError(
          f"{where}: {_CSV_REL} {row[i_rel]!r} is not an integer") from None
    _add_judgement(qrels, topic, doc, rel)
  return qrels


def _read_trec_qrels(f, path: str) -> Qrels:
  qrels: Qrels = {}
  for line_number, line in enumerate(f, start=1):
    fields = line.split()
    if not fields:
      continue
    if len(fields) != 4:
      raise MochegInputError(
          f"{path}: line {line_number}: expected 4 fields 'topic iteration doc relevancy', "
          f"found {len(fields)}: {line.strip()[:100]!r}")
    try:
      rel = _parse_relevancy(fields[3])
    except ValueError:
      raise MochegInputError(
          f"{path}: line {line_number}: relevancy {fields[3]!r} is not an integer") from None
    _add_judgement(qrels, fields[0], fields[2], rel)
  return qrels


def read_qrels(path: str | os.PathLike) -> Qrels:
  """Reads Mocheg CSV qrels or TREC whitespace qrels (detected from the first line).

  Args:
    path: the qrels file.

  Returns:
    topic -> document -> relevancy, in file order. A document judged twice for one topic
    keeps the higher relevancy. Topics whose documents are all non-relevant are kept (the
    metrics decide what counts as relevant).

  Raises:
    MochegInputError: missing file, unknown format, or a malformed row (named by file and
      row/line).
  """
  path_str = os.fspath(path)
  with _open_text(path, "qrels") as f:
    first = ""
    for first in f:
      if first.strip():
        break
    f.seek(0)
    if not first.strip():
      raise MochegInputError(f"{path_str}: empty qrels file")
    try:
      header = [h.strip().upper() for h in next(csv.reader([first]))]
    except csv.Error:
      header = []
    if _CSV_TOPIC in header and _CSV_REL in header:
      return _read_csv_qrels(f, path_str)
    if len(first.split()) == 4:
      return _read_trec_qrels(f, path_str)
    raise MochegInputError(
        f"{path_str}: unrecognised qrels format; expected a CSV header "
        f"'TOPIC,ITERATION,DOCUMENT#,RELEVANCY' or TREC lines 'topic iteration doc "
        f"relevancy', found {first.strip()[:100]!r}")


def _check_id(value: str, what: str, path: str) -> None:
  if not value or _WHITESPACE.search(value):
    raise ValueError(
        f"{path}: {what} {value!r} cannot be written in a TREC file (empty or has whitespace)")


def write_qrels(path: str | os.PathLike, qrels: Mapping[str, Mapping[str, int]]) -> None:
  """Writes TREC whitespace qrels, `topic 0 doc relevancy` per line, in mapping order.

  Raises:
    ValueError: an id is empty or contains whitespace (it could not be read back).
  """
  path_str = os.fspath(path)
  with open(path, "w", encoding="utf-8") as f:
    for topic, docs in qrels.items():
      _check_id(str(topic), "topic", path_str)
      for doc, rel in docs.items():
        _check_id(str(doc), "document id", path_str)
        f.write(f"{topic} 0 {doc} {int(rel)}\n")


def write_run(path: str | os.PathLike, run: Mapping[str, Sequence[tuple[str, float]]],
              tag: str) -> None:
  """Writes a ranked run in TREC format, `qid Q0 docid rank score tag`, ranks from 1.

  Each query's list must already be ranked, best first, with non-increasing scores: TREC
  tools (and `read_run`) order a run by score, so a list whose scores rise would be read
  back as a different ranking. Scores are written with `repr` so they read back exactly.

  Raises:
    ValueError: scores rise within a list, a score is NaN, or an id/tag is empty or has
      whitespace.
  """
  path_str = os.fspath(path)
  _check_id(tag, "tag", path_str)
  with open(path, "w", encoding="utf-8") as f:
    for qid, ranked in run.items():
      _check_id(str(qid), "query id", path_str)
      previous = math.inf
      for rank, (doc, score) in enumerate(ranked, start=1):
        _check_id(str(doc), "document id", path_str)
        score = float(score)
        if math.isnan(score):
          raise ValueError(f"{path_str}: query {qid!r} rank {rank}: score is NaN")
        if score > previous:
          raise ValueError(
              f"{path_str}: query {qid!r} rank {rank}: score {score!r} is higher than the "
              f"score {previous!r} at rank {rank - 1}; lists must be ranked best first")
        previous = score
        f.write(f"{qid} Q0 {doc} {rank} {score!r} {tag}\n")


def read_run(path: str | os.PathLike) -> Run:
  """Reads a TREC run, `qid Q0 docid rank score tag` per line.

  Returns:
    qid -> [(docid, score)], ordered by score descending, ties broken by the rank column
    (then by file order). Queries keep their first-seen order. Duplicate documents are kept
    as they are; the metrics count a document once, at its best position.

  Raises:
    MochegInputError: missing file or a malformed line (named by file and line).
  """
  path_str = os.fspath(path)
  rows: dict[str, list[tuple[str, float, int]]] = {}
  with _open_text(path, "run") as f:
    for line_number, line in enumerate(f, start=1):
      fields = line.split()
      if len(fields) != 6:
        if not fields:
          continue
        raise MochegInputError(
            f"{path_str}: line {line_number}: expected 6 fields 'qid Q0 docid rank score "
            f"tag', found {len(fields)}: {line.strip()[:100]!r}")
      try:
        entry = (fields[2], float(fields[4]), int(fields[3]))
      except ValueError:
        raise _bad_run_number(path_str, line_number, fields) from None
      if entry[1] != entry[1]:  # NaN
        raise MochegInputError(f"{path_str}: line {line_number}: score is NaN")
      queue = rows.get(fields[0])
      if queue is None:
        rows[fields[0]] = [entry]
      else:
        queue.append(entry)
  run: Run = {}
  for qid, entries in rows.items():
    # A stable sort: score descending, then rank; full ties keep file order.
    entries.sort(key=lambda e: (-e[1], e[2]))
    run[qid] = [(doc, score) for doc, score, _ in entries]
  return run


def _bad_run_number(path: str, line_number: int, fields: list[str]) -> MochegInputError:
  try:
    int(fields[3])
  except ValueError:
    return MochegInputError(f"{path}: line {line_number}: rank {fields[3]!r} is not an integer")
  return MochegInputError(f"{path}: line {line_number}: score {fields[4]!r} is not a number")
