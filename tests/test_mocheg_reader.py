import os

import pytest

from mocheg_jax.data import labels
from mocheg_jax.data.mocheg import MochegRelease, write_sentence_kb
from mocheg_jax.data.report import MochegInputError
from tests.release_fixture import write_release


@pytest.fixture()
def release(tmp_path):
  write_release(str(tmp_path))
  return MochegRelease(tmp_path)


def test_claims_are_merged_per_claim(release):
  claims = {c.claim_id: c for c in release.claims("train")}
  assert sorted(claims) == [1, 2, 4]
  one = claims[1]
  assert one.evidence == ("It has three arches.", "Built in 1901.")  # no "nan", tags gone
  assert one.label == labels.SUPPORTED
  assert one.explanation == "The bridge indeed has three arches."  # first row's outline
  assert one.rating == "TRUE"


def test_explanation_extracted_from_ruling_when_outline_empty(release):
  claims = {c.claim_id: c for c in release.claims("train")}
  assert claims[2].explanation == (
      "The photograph shows a different bridge, so the claim is false.")
  assert claims[2].proof_images == ("00002-proof-01-bridge.jpg",)


def test_raw_rating_used_when_cleaned_label_missing(release):
  claims = {c.claim_id: c for c in release.claims("train")}
  assert claims[4].label == labels.NEI
  assert claims[4].evidence == ()


def test_bad_rows_are_skipped_and_reported(release):
  release.claims("train")
  reasons = [(os.path.basename(r.file), r.row, r.reason, r.detail)
             for r in release.report.records]
  assert ("Corpus2.csv", 7, "wrong number of fields", "expected 9, found 3") in reasons
  assert any(row == 5 and reason == "unknown label" and "unknown rating 'maybe'" in detail
             for _, row, reason, detail in reasons)
  assert "skipped 2 records" in release.report.summary()


def test_sentences_from_file_and_rebuilt_agree(tmp_path):
  with_file, without = tmp_path / "a", tmp_path / "b"
  write_release(str(with_file))
  write_release(str(without), with_sentence_file=False)
  read = [(s.corpus_id, s.text) for s in MochegRelease(with_file).iter_sentences()]
  rebuilt_release = MochegRelease(without)
  rebuilt = [(s.corpus_id, s.text) for s in rebuilt_release.iter_sentences()]
  assert read == rebuilt
  assert read[:2] == [("1-7-0", "Dr. Venn opened it."), ("1-7-1", "It has three arches.")]
  assert any(r.reason == "non-integer ids" for r in rebuilt_release.report.records)
  out = tmp_path / "rebuilt.csv"
  assert write_sentence_kb(MochegRelease(without), out) == len(read)
  assert out.read_text().splitlines()[1] == "1,7,0,1-7-0,Dr. Venn opened it."


def test_qrels(release):
  text = release.text_qrels("train")
  assert text[1] == {"1-7-1": 1, "1-7-2": 1}
  assert text[2] == {"2-8-0": 1, "2-8-1": 0}
  assert release.image_qrels("train") == {2: {"00002-00008-01-bridge.jpg": 1}}


def test_kb_images_cleaned_with_reasons(release):
  assert release.kb_images(clean=False) == [
      "00001-00007-01-site-logo.jpg", "00001-00007-02-.jpg", "00001-00007-03-photo.jpg",
      "00001-00007-04-broken.jpg", "00002-00008-01-bridge.jpg"]
  assert release.kb_images() == ["00001-00007-03-photo.jpg", "00002-00008-01-bridge.jpg"]
  reasons = {os.path.basename(r.file): (r.reason, r.detail) for r in release.report.records}
  assert reasons["00001-00007-01-site-logo.jpg"] == ("name contains 'logo'", "")
  assert reasons["00001-00007-02-.jpg"] == ("smaller than 400x400", "120x90")
  assert reasons["00001-00007-04-broken.jpg"][0] == "unreadable image"


def test_missing_file_and_column_name_them(tmp_path):
  write_release(str(tmp_path))
  os.remove(tmp_path / "test" / "Corpus2.csv")
  with pytest.raises(MochegInputError, match=r"test/Corpus2.csv: missing file"):
    MochegRelease(tmp_path).claims("test")
  (tmp_path / "Corpus3.csv").write_text("claim_id,Origin Document\n1,x\n")
  with pytest.raises(MochegInputError, match=r"Corpus3.csv: missing column\(s\) "
                     r"'relevant_document_id'"):
    list(MochegRelease(tmp_path).iter_articles())
  with pytest.raises(MochegInputError, match="does not exist"):
    MochegRelease(tmp_path / "nowhere")
