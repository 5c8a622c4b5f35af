"""data/prepare.py: a tiny world made ready once, reused on rerun; a bad release named."""

import json
import os

import pytest

from mocheg_jax.data import prepare as prepare_lib
from mocheg_jax.data import tfds_mocheg


def test_prepare_makes_the_tiny_world_once(tmp_path):
  lines = []
  data = prepare_lib.prepare(str(tmp_path), scale="tiny", log=lines.append)
  assert data.release == os.path.join(tmp_path, "release")
  assert "written to" in lines[0]
  for folder in (data.wordpiece, data.bpe):
    assert os.path.exists(os.path.join(folder, prepare_lib.DONE_MARKER))
  claims = tfds_mocheg.load(data.tfds, "claims").as_data_source()
  assert len(claims["train"]) > 0 and len(claims["test"]) > 0
  marker = os.path.join(data.wordpiece, prepare_lib.DONE_MARKER)
  stamp = os.path.getmtime(marker)
  again = prepare_lib.prepare(str(tmp_path), scale="tiny", log=lines.append)
  assert "reused from" in lines[-1]
  assert again.tfds == data.tfds and os.path.getmtime(marker) == stamp


def test_prepare_names_a_missing_release(tmp_path):
  with pytest.raises(NotADirectoryError, match="no_such_release"):
    prepare_lib.prepare(str(tmp_path / "out"), release=str(tmp_path / "no_such_release"))


def test_training_data_defaults_to_the_tiny_world(tmp_path):
  from mocheg_jax.train import config as config_lib
  from mocheg_jax.train.data import prepared_data
  config = config_lib.base_config()
  data = prepared_data(config, str(tmp_path), log=lambda _: None)
  assert data.release == os.path.join(tmp_path, "data", "release")
  config.data.release = str(tmp_path / "missing")
  with pytest.raises(NotADirectoryError, match="missing"):
    prepared_data(config, str(tmp_path / "other"), log=lambda _: None)


def test_prepare_refuses_a_folder_holding_another_world(tmp_path):
  prepare_lib.prepare(str(tmp_path), scale="tiny", seed=0, log=lambda _: None)
  with open(os.path.join(tmp_path, "release", prepare_lib.WORLD_RECORD)) as f:
    assert json.load(f) == {"scale": "tiny", "seed": 0}
  with pytest.raises(ValueError, match=r"seed 0\).*asks for \(scale 'tiny', seed 1\).*"
                                       r"data.world_seed=0"):
    prepare_lib.prepare(str(tmp_path), scale="tiny", seed=1, log=lambda _: None)
  with pytest.raises(ValueError, match="asks for \\(scale 'small', seed 0\\)"):
    prepare_lib.prepare(str(tmp_path), scale="small", seed=0, log=lambda _: None)


def test_world_seed_decouples_the_world_from_the_model_seed(tmp_path):
  from mocheg_jax.train import config as config_lib
  from mocheg_jax.train.data import prepared_data
  config = config_lib.base_config()
  config.data.dir = str(tmp_path / "data")
  prepared_data(config, str(tmp_path), log=lambda _: None)  # World seed 0 (the run's seed).
  config.seed = 1
  with pytest.raises(ValueError, match="data.world_seed=0"):
    prepared_data(config, str(tmp_path), log=lambda _: None)
  config.data.world_seed = 0
  lines = []
  prepared_data(config, str(tmp_path), log=lines.append)
  assert any("synthetic world (tiny, seed 0) reused" in line for line in lines)
