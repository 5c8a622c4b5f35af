import pytest
from PIL import Image

from mocheg_jax.data import images, labels
from mocheg_jax.data.report import SkipReport


@pytest.mark.parametrize("raw, expected", [
    ("True", labels.SUPPORTED), ("TRUE", labels.SUPPORTED), ("Status: True.", labels.SUPPORTED),
    ("  mostly   TRUE ", labels.SUPPORTED), ("Correct Attribution", labels.SUPPORTED),
    ("False", labels.REFUTED), ("Labeled Satire", labels.REFUTED),
    ("Rating: Mostly False", labels.REFUTED), ("Miscaptioned", labels.REFUTED),
    ("Mixture", labels.NEI), ("Unproven", labels.NEI), ("Research In Progress", labels.NEI),
    ("Outdated!", labels.NEI),
])
def test_raw_ratings_map_to_classes(raw, expected):
  assert labels.label_from_rating(raw) == expected


def test_unknown_rating_and_class_are_rejected_by_name():
  with pytest.raises(labels.UnknownLabelError, match="'Probably'"):
    labels.label_from_rating("Probably")
  with pytest.raises(labels.UnknownLabelError, match="'maybe'"):
    labels.label_from_name("maybe")
  assert [labels.label_from_name(n) for n in ("refuted", "Supported", "nei")] == [0, 1, 2]


def test_image_names_round_trip():
  kb = images.kb_image_name(281, 1920, 1)
  assert kb == "00281-01920-01-.jpg"
  proof = images.proof_image_name(281, 11, "last-years-posters.jpg")
  assert proof == "00281-proof-11-last-years-posters.jpg"
  assert images.parse_image_name(kb) == images.ImageName(281, 1920, 1, ".jpg")
  parsed = images.parse_image_name(proof)
  assert parsed.is_proof and (parsed.claim_id, parsed.img_id) == (281, 11)
  # Ids wider than their padding and descriptions with dashes parse by fields, not offsets.
  wide = images.parse_image_name("123456-00002-03-a-b-c.png")
  assert (wide.claim_id, wide.relevant_document_id, wide.description) == (123456, 2, "a-b-c.png")
  assert len(images.kb_image_name(1, 2, 3, "x" * 200)) == len("00001-00002-03-") + 80 + 4
  with pytest.raises(ValueError, match="not-an-image-name"):
    images.parse_image_name("not-an-image-name.jpg")


def test_cleaning_rules(tmp_path):
  def save(name, size):
    Image.new("RGB", size).save(tmp_path / name, format="JPEG")
    return name
  names = [save("1-2-01-photo.jpg", (400, 400)), save("1-2-02-banner.jpg", (800, 800)),
           save("1-2-03-x.jpg", (399, 900)), save("1-2-04-y.jpg", (1200, 800)),
           save("1-2-05-rating-false.jpg", (500, 500))]
  report = SkipReport()
  assert images.clean_images(tmp_path, names, report) == ["1-2-01-photo.jpg", "1-2-04-y.jpg"]
  assert report.by_reason() == {"name contains 'banner'": 1,
                                "smaller than 400x400": 1,
                                "name contains 'rating-false'": 1}
  assert report.summary().startswith("skipped 3 records")
  assert [r.detail for r in report.records if r.reason.startswith("smaller")] == ["399x900"]
