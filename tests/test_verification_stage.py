"""The verification stage's choice of the verifier that writes the system labels."""

import types

import numpy as np
import pytest

from mocheg_jax.train import task as task_lib
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


WRONG = [0, 0, 0, 0, 0, 0]
PARTLY = [0, 1, 2, 0, 1, 0]
SYSTEM = verification_stage.SYSTEM_TRAINED


@pytest.mark.parametrize("predictions, mode", [
    ((LABELS, WRONG, PARTLY), "text+image"),
    ((WRONG, LABELS, PARTLY), "text"),     # Retrieved images mislead the text+image one...
    ((WRONG, PARTLY, LABELS), SYSTEM),     # ...unless it learnt from retrieved evidence.
    ((PARTLY, PARTLY, PARTLY), "text+image"),  # A tie keeps the paper's.
    ((WRONG, PARTLY, PARTLY), "text"),         # Then the gold-trained text-only one.
])
def test_the_system_labels_come_from_the_best_verifier_on_dev_system_evidence(
    predictions, mode):
  asked = []
  trained = {m: _trained(p, asked)
             for m, p in zip(verification_stage.SYSTEM_LABEL_MODES, predictions, strict=True)}
  choice = verification_stage.choose_system_verifier(trained, "results.csv")
  assert choice["mode"] == mode
  assert choice["stage"] == verification_stage.stage_folder(mode)
  assert set(choice["dev"]) == set(verification_stage.SYSTEM_LABEL_MODES)
  assert max(choice["dev"].values()) == choice["dev"][mode]
  assert asked == [("val", "results.csv")] * 3  # Dev claims, system evidence.


def test_each_verifier_trains_in_a_folder_of_its_own_on_its_evidence(tmp_path):
  folders = {m: verification_stage.stage_folder(m) for m in verification_stage.MODES}
  assert folders["text+image"] == "stages/verify_text_image"  # The manifest's default.
  assert len(set(folders.values())) == len(folders)
  csv = str(tmp_path / "runs" / "retrieval_results.csv")
  for name, mode in verification_stage.MODES.items():
    config = verification_stage._config("tiny", str(tmp_path), 0, "random", mode, csv)
    assert (config.verify.use_text, config.verify.use_image) == mode[:2]
    assert config.verify.evidence == (csv if name == SYSTEM else "gold")
    assert config.verify.item_context == config.verify.item_gate == (name == SYSTEM)
    assert config.verify.train_also_gold == (name == SYSTEM)
    assert config.ema_decay == (0.99 if name == SYSTEM else 0.0)
    # The result CSV's contents are recorded: a rerun after it changed trains anew.
    assert task_lib.input_files(config) == ([csv] if name == SYSTEM else [])


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


def test_the_ensembles_extra_seeds_train_on_the_same_world_and_features(tmp_path):
  work, csv = str(tmp_path), str(tmp_path / "runs" / "retrieval_results.csv")
  folders = verification_stage.ensemble_folders("small")
  assert folders == ["stages/verify_text_image", "stages/verify_text_image_seed1",
                     "stages/verify_text_image_seed2"]
  assert verification_stage.ensemble_folders("tiny")[0] == verification_stage.stage_folder(
      verification_stage.ENSEMBLE_MODE)
  own = verification_stage._config("small", work, 5, "random", verification_stage.MODES[
      verification_stage.ENSEMBLE_MODE], csv)
  extra = verification_stage._ensemble_config("small", work, 5, 2, "random", csv)
  assert (extra.seed, extra.data.world_seed, own.seed, own.data.world_seed) == (7, 5, 5, -1)
  extra.seed, extra.data.world_seed = own.seed, own.data.world_seed
  assert extra.to_dict() == own.to_dict()  # Nothing else differs: same evidence, same store.


def test_the_ensemble_averages_its_members_probabilities():
  claims = [ClaimEvidence(i, f"claim {i}", y, (), ()) for i, y in enumerate(LABELS[:2])]

  def member(probabilities):
    predict = lambda model, given: np.asarray(probabilities) if given is claims else None
    inference = types.SimpleNamespace(predict=predict)
    return types.SimpleNamespace(task=types.SimpleNamespace(inference=inference), model=None)

  averaged = verification_stage.average_probabilities(
      [member([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6]]), member([[0.0, 0.9, 0.1], [0.2, 0.4, 0.4]])],
      claims)
  np.testing.assert_allclose(averaged, [[0.3, 0.6, 0.1], [0.2, 0.3, 0.5]])
  assert verification_stage.ensemble_name(3) == "Stance (text+image, 3 seeds averaged)"
