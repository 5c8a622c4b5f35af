"""scripts/convert.py: HF -> orbax -> HF through our model, checked against transformers."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.models import zoo
from mocheg_jax.models.hf import convert

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tiny_bert(folder):
  torch.manual_seed(0)
  config = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=37)
  model = transformers.BertModel(config).eval()
  model.save_pretrained(folder, safe_serialization=True)
  with open(os.path.join(folder, "vocab.txt"), "w") as f:  # A non-weight file to carry.
    f.write("[PAD]\n")
  return model


def _convert(*args):
  env = dict(os.environ, PYTHONPATH=REPO)
  return subprocess.run([sys.executable, "scripts/convert.py", *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=300)


def test_hf_to_orbax_and_back(tmp_path):
  hf_dir, orbax_dir, back = tmp_path / "hf", tmp_path / "orbax", tmp_path / "back"
  reference = _tiny_bert(hf_dir)
  out = _convert(f"--from={hf_dir}", f"--to={orbax_dir}")
  assert out.returncode == 0, out.stderr
  assert (orbax_dir / convert.ORBAX_DIR).is_dir()
  assert not (orbax_dir / "model.safetensors").exists()
  assert (orbax_dir / "vocab.txt").read_text() == "[PAD]\n"
  ids = np.array([[2, 5, 7, 9, 0], [3, 4, 0, 0, 0]])
  mask = (ids > 0).astype(np.int32)
  ours = zoo.load(orbax_dir, head="model")
  hidden, _ = ours(ids, mask)
  with torch.no_grad():
    expected = reference(torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state
  np.testing.assert_allclose(np.asarray(hidden)[mask == 1], expected.numpy()[mask == 1],
                             atol=1e-4)
  out = _convert(f"--from={orbax_dir}", f"--to={back}", "--format=hf")
  assert out.returncode == 0, out.stderr
  reloaded = transformers.BertModel.from_pretrained(back).eval()
  with torch.no_grad():
    again = reloaded(torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state
  np.testing.assert_allclose(again.numpy(), expected.numpy(), atol=1e-5)


def test_unsupported_model_type_is_named(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
  with pytest.raises(MochegInputError, match="unsupported model_type 'gpt2'"):
    zoo.model_type(tmp_path)
  out = _convert(f"--from={tmp_path}", f"--to={tmp_path / 'x'}")
  assert out.returncode == 1 and "Traceback" not in out.stderr
  assert "config.json: unsupported model_type 'gpt2'" in out.stderr
