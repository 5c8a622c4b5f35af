"""The verification stage's choice of the verifier that writes the system labels."""

import types

import numpy as np
import pytest

from mocheg_jax.verification import stage as verification_stage
from mocheg_jax.verification.evidence import ClaimEvidence

LABELS = [0, 1, 2, 0, 1, 2]


def _trained(predicted: list[int], asked: list):
  """A stand-in for a trained verifier: its dev claims and fixed predictions."""
  claims = [ClaimEvidence(i, f"claim {i}", y, (), ()) for i, y in enumerate(LABELS)]

  def evidence(split, source):
    asked.append((split, source))
    return claims

  def predict(model, given):
    assert given is claims
    return np.eye(3)[predicted]

  inference = types.SimpleNamespace(evidence=evidence, predict=predict)
  return types.SimpleNamespace(task=types.SimpleNamespace(inference=inference), model=None)


@pytest.mark.parametrize("text_image, text, mode", [
    (LABELS, [0, 0, 0, 0, 0, 0], "text+image"),
    ([0, 0, 0, 0, 0, 0], LABELS, "text"),     # Retrieved images mislead the text+image one.
    ([0, 1, 2, 0, 1, 0], [0, 1, 2, 0, 1, 0], "text+image"),  # A tie keeps the paper's.
])
def test_the_system_labels_come_from_the_better_verifier_on_dev_system_evidence(
    text_image, text, mode):
  asked = []
  trained = {"text+image": _trained(text_image, asked), "text": _trained(text, asked)}
  choice = verification_stage.choose_system_verifier(trained, "results.csv")
  assert choice["mode"] == mode
  assert choice["stage"] == verification_stage.stage_folder(mode)
  assert choice["stage"] in ("stages/verify_text_image", "stages/verify_text")
  assert set(choice["dev"]) == {"text+image", "text"}
  assert max(choice["dev"].values()) == choice["dev"][mode]
  assert asked == [("val", "results.csv")] * 2  # Dev claims, system evidence.


class _SavedConfig:
  """A stand-in for a read-only Checkpointer holding one config."""

  def __init__(self, config):
    self.config = config

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False

  def restore_config(self, step):
    assert step == 7
    return self.config


@pytest.mark.parametrize("init, want", [
    ("/models/clip-vit-base-patch32", "/models/clip-vit-base-patch32"),  # The paper's.
    ("WORK/stages/captions", "WORK/stages/captions"),  # Caption pre-training.
    ("random", "WORK/stages/retrieval_image"),  # Nothing pretrained: the retriever.
])
def test_verifiers_read_the_clip_the_image_retriever_started_from(monkeypatch, tmp_path, init,
                                                                  want):
  work = str(tmp_path)
  init, want = init.replace("WORK", work), want.replace("WORK", work)
  asked = []

  def checkpoint_step(workdir, which):
    asked.append((workdir, which))
    return _SavedConfig({"model": {"init": init}}), 7

  monkeypatch.setattr(verification_stage, "checkpoint_step", checkpoint_step)
  assert verification_stage.frozen_clip(work) == want
  assert asked == [(f"{work}/stages/retrieval_image", "latest")]
