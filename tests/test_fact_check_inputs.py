"""The fact-checker refuses bad claims and images before any model runs."""

import numpy as np
import pytest
from PIL import Image

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.pipeline.fact_checker import MAX_CLAIM_CHARS, check_claims


def test_claims_are_normalised_and_images_made_absolute(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save("photo.png")
  claims, images = check_claims(["  The flag\nis red. ", "x" * MAX_CLAIM_CHARS],
                                [None, "photo.png"])
  assert claims == ["The flag is red.", "x" * MAX_CLAIM_CHARS]
  assert images == [None, str(tmp_path / "photo.png")]
  assert check_claims(["a"]) == (["a"], [None])


@pytest.mark.parametrize("claims, images, message", [
    (["fine", " \t"], None, "claim 1: empty"),
    (["y" * (MAX_CLAIM_CHARS + 1)], None, "claim 0: 2,001 characters"),
    (["fine", 3], None, "claim 1: a int, not a string"),
    (["fine"], ["missing.png"], "claim 0: cannot read image 'missing.png'"),
])
def test_bad_input_is_named(claims, images, message, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(MochegInputError, match=message):
    check_claims(claims, images)


def test_undecodable_image_and_misuse(tmp_path):
  bad = tmp_path / "photo.png"
  bad.write_text("not a picture")
  with pytest.raises(MochegInputError, match="not an image format Pillow can decode"):
    check_claims(["fine"], [str(bad)])
  with pytest.raises(TypeError, match="use check for one"):
    check_claims("one claim")
  with pytest.raises(ValueError, match="2 claims but 1 images"):
    check_claims(["a", "b"], [None])
