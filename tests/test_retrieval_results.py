"""The retrieval result CSV: round trips with awkward texts, and errors naming row/column."""

from __future__ import annotations

import csv
import json
import math
import re

import pytest

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.retrieval import results as results_lib
from mocheg_jax.retrieval.results import RetrievedEvidence

AWKWARD = (
    'He said, "no", then left.',            # comma and quotes
    "line one\nline two\r\nline three\r",   # every line end
    "tab\there; semicolon; \\backslash\\",
    "[\"looks\", \"like\", \"json\"]",
    "",                                      # an empty sentence
    "  padded  ",
    "naïve café — “curly” ‘quotes’ 日本語 🙂",
    "unicode line\u2028separators\u2029\x85 and NUL\x00 and \x1b escape",
)


def _rows():
  return [
      RetrievedEvidence(
          claim_id=281, text_ids=tuple(f"281-1920-{i}" for i in range(len(AWKWARD))),
          texts=AWKWARD, text_scores=tuple(10.0 - i for i in range(len(AWKWARD))),
          images=("00281-01920-01-a,b.jpg", "00281-01920-02-x.png"), image_scores=(0.9, 0.9)),
      RetrievedEvidence(claim_id=7),  # nothing retrieved
      RetrievedEvidence(claim_id=3, text_ids=("3-1-0",), texts=("One.",), text_scores=(-1.5,)),
  ]


def test_round_trip(tmp_path):
  path = tmp_path / "sub" / "results.csv"
  assert results_lib.write_results(path, _rows()) == 3
  got = results_lib.read_results(path)
  assert list(got) == [281, 7, 3]  # file order
  assert list(got.values()) == _rows()
  # Every record is one physical line: no raw line break inside a cell.
  assert len(path.read_text(encoding="utf-8").splitlines()) == 4
  # The run views the metrics score.
  assert results_lib.text_run(got)["3"] == [("3-1-0", -1.5)]
  assert results_lib.image_run(got)["281"][0] == ("00281-01920-01-a,b.jpg", 0.9)
  assert results_lib.image_run(got)["7"] == []


def test_results_from_runs():
  sentences = {"1-1-0": "A, b.", "1-1-1": "C\nd", "2-2-0": "E"}
  text = {"1": [("1-1-1", 3.0), ("1-1-0", 2.0), ("2-2-0", 1.0)]}
  image = {"2": [("00002-00002-00-x.jpg", 0.5)]}
  rows = results_lib.results_from_runs([1, 2], text, sentences, image, k=2)
  assert rows[0] == RetrievedEvidence(1, ("1-1-1", "1-1-0"), ("C\nd", "A, b."), (3.0, 2.0))
  assert rows[1] == RetrievedEvidence(2, images=("00002-00002-00-x.jpg",), image_scores=(0.5,))
  with pytest.raises(MochegInputError, match="'9-9-9' is not in the knowledge base"):
    results_lib.results_from_runs([1], {"1": [("9-9-9", 1.0)]}, sentences)


def test_write_refuses_bad_rows(tmp_path):
  path = tmp_path / "r.csv"
  with pytest.raises(ValueError, match="claim 7 is written twice"):
    results_lib.write_results(path, [RetrievedEvidence(7), RetrievedEvidence(7)])
  with pytest.raises(ValueError, match="claim 1 text: .*ranked best first"):
    results_lib.write_results(path, [RetrievedEvidence(1, ("a", "b"), ("A", "B"), (1.0, 2.0))])
  with pytest.raises(ValueError, match="claim 1 image: .*not a finite number"):
    results_lib.write_results(path, [RetrievedEvidence(1, images=("x",),
                                                       image_scores=(math.nan,))])
  with pytest.raises(ValueError, match="3 text ids, 2 texts"):
    RetrievedEvidence(1, ("a", "b", "c"), ("A", "B"), (1.0, 1.0, 1.0))


def _write(path, header, rows):
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.writer(f)
    writer.writerow(header)
    writer.writerows(rows)


GOOD = ["5", '["5-1-0"]', '["text"]', "[2.5]", '["00005-00001-00-a.jpg"]', "[0.3]"]


def _bad(tmp_path, row, header=results_lib.COLUMNS):
  path = tmp_path / "bad.csv"
  _write(path, header, [GOOD, row])
  with pytest.raises(MochegInputError) as e:
    results_lib.read_results(path)
  assert str(path) in str(e.value)
  return str(e.value)


def _with(index, value):
  row = list(GOOD)
  row[0] = "6"
  row[index] = value
  return row


@pytest.mark.parametrize("index,value,message", [
    (0, "six", r"row 2, column claim_id: 'six' is not an integer"),
    (0, "5", r"row 2, column claim_id: claim 5 already appeared in row 1"),
    (1, '["5-1-0"', r"row 2, column text_evidence_ids: not valid JSON"),
    (2, '{"a": 1}', r"row 2, column text_evidence: expected a JSON array, found dict"),
    (2, "[3]", r"row 2, column text_evidence: item 0 is 3, expected a string"),
    (3, '["2.5"]', r"row 2, column text_scores: item 0 is '2.5', expected a number"),
    (3, "[true]", r"row 2, column text_scores: item 0 is True, expected a number"),
    (3, "[2.5, 1.0]", r"row 2, columns text_evidence_ids/text_evidence/text_scores: lengths "
                      r"1/1/2 differ"),
    (5, "[]", r"row 2, columns image_evidence/image_scores: lengths 1/0 differ"),
    (5, "[NaN]", r"row 2, column image_scores: score nan at position 0 is not a finite"),
])
def test_bad_cells_name_row_and_column(tmp_path, index, value, message):
  error = _bad(tmp_path, _with(index, value))
  assert re.search(message, error), error


def test_unranked_scores_and_shape_errors(tmp_path):
  row = ["6", '["a", "b"]', '["A", "B"]', "[1.0, 2.0]", "[]", "[]"]
  assert "row 2, column text_scores: score 2.0 at position 1 is higher" in _bad(tmp_path, row)
  assert "row 2: expected 6 fields, found 5" in _bad(tmp_path, GOOD[:5])
  header = [c for c in results_lib.COLUMNS if c != "image_scores"]
  assert "header lacks column(s) image_scores" in _bad(tmp_path, GOOD[:5], header=header)


def test_lenient_cases(tmp_path):
  """Extra columns are ignored, empty list cells read as [], blank lines are skipped."""
  path = tmp_path / "ok.csv"
  _write(path, [*results_lib.COLUMNS, "note"],
         [GOOD + ["x"], [], ["9", "", "", "", "", "", "y"]])
  got = results_lib.read_results(path)
  assert got[9] == RetrievedEvidence(9)
  assert got[5].texts == ("text",) and got[5].image_scores == (0.3,)


def test_unusable_files(tmp_path):
  with pytest.raises(MochegInputError, match="missing retrieval result file"):
    results_lib.read_results(tmp_path / "nope.csv")
  (tmp_path / "empty.csv").write_text("")
  with pytest.raises(MochegInputError, match="empty file"):
    results_lib.read_results(tmp_path / "empty.csv")
  with pytest.raises(MochegInputError, match="is a directory"):
    results_lib.read_results(tmp_path)


def test_cells_are_plain_json(tmp_path):
  """Another tool (pandas + json.loads) can read the file without our reader."""
  path = tmp_path / "r.csv"
  results_lib.write_results(path, _rows())
  with open(path, newline="", encoding="utf-8") as f:
    first = next(csv.DictReader(f))
  assert tuple(json.loads(first["text_evidence"])) == AWKWARD
  assert json.loads(first["image_scores"]) == [0.9, 0.9]
