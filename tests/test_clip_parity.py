"""Our CLIP against transformers' CLIPModel (PyTorch) on a tiny random, seeded checkpoint."""

from __future__ import annotations

import io
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from PIL import Image

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from mocheg_jax.data import vision  # noqa: E402
from mocheg_jax.data.report import MochegInputError  # noqa: E402
from mocheg_jax.models import clip  # noqa: E402
from mocheg_jax.models.hf import clip as hf_clip  # noqa: E402
from mocheg_jax.models.hf import convert  # noqa: E402

ATOL = 1e-4
VOCAB, EOS, BOS, PAD = 99, 98, 97, 0
IMAGE = 32


def _hf_config(**text_overrides) -> transformers.CLIPConfig:
  text = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=37, num_attention_heads=4,
              num_hidden_layers=2, max_position_embeddings=16, eos_token_id=EOS,
              bos_token_id=BOS, pad_token_id=PAD)
  text.update(text_overrides)
  return transformers.CLIPConfig(
      text_config=text,
      vision_config=dict(hidden_size=48, intermediate_size=61, num_attention_heads=4,
                         num_hidden_layers=2, image_size=IMAGE, patch_size=8),
      projection_dim=24, logit_scale_init_value=2.3)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  torch.manual_seed(0)
  reference = transformers.CLIPModel(_hf_config()).eval()
  with torch.no_grad():  # A non-trivial scale, so a wrong logit_scale mapping shows.
    reference.logit_scale.fill_(1.7)
  folder = str(tmp_path_factory.mktemp("clip_hf"))
  reference.save_pretrained(folder, safe_serialization=True)
  return folder, reference


@pytest.fixture(scope="module")
def ours(checkpoint):
  return hf_clip.load(checkpoint[0])


def _texts(padded: bool = True):
  """Ragged texts as the CLIP tokenizer makes them: BOS ... EOS, then right padding."""
  rng = np.random.default_rng(0)
  lengths = [12, 7, 3] if padded else [12, 12, 12]
  ids = rng.integers(1, BOS, size=(3, 12))
  mask = np.zeros((3, 12), np.int64)
  for row, n in enumerate(lengths):
    ids[row, 0], ids[row, n - 1], ids[row, n:] = BOS, EOS, PAD
    mask[row, :n] = 1
  return ids, mask


def _pixels(n: int = 2, seed: int = 1) -> np.ndarray:
  return np.random.default_rng(seed).normal(size=(n, IMAGE, IMAGE, 3)).astype(np.float32)


def _torch_run(reference, ids, mask, pixels):
  with torch.no_grad():
    return reference(input_ids=torch.from_numpy(ids),
                     attention_mask=None if mask is None else torch.from_numpy(mask),
                     pixel_values=torch.from_numpy(pixels.transpose(0, 3, 1, 2)),  # NCHW
                     output_hidden_states=True)


def _close(ours_value, torch_value, atol=ATOL):
  np.testing.assert_allclose(np.asarray(ours_value), torch_value.numpy(), atol=atol, rtol=0)


@nnx.jit
def _everything(model, ids, mask, pixels):
  """Every output we compare, in one compiled call (eager NNX compiles op by op: slow)."""
  return dict(text=model.text_features(ids, mask), image=model.image_features(pixels),
              out=model(ids, mask, pixels), encode_text=model.encode_text(ids, mask),
              encode_image=model.encode_image(pixels))


@pytest.mark.parametrize("padded", [True, False])
def test_embeddings_logits_and_token_states_match_hf(checkpoint, ours, padded):
  _, reference = checkpoint
  ids, mask = _texts(padded)
  mask = mask if padded else None
  pixels = _pixels()
  out = _torch_run(reference, ids, mask, pixels)
  got = _everything(ours, ids, mask, pixels)
  text, image, logits = got["text"], got["image"], got["out"]

  torch_ids = torch.from_numpy(ids)
  torch_mask = None if mask is None else torch.from_numpy(mask)
  torch_pixels = torch.from_numpy(pixels.transpose(0, 3, 1, 2))  # HF is channels-first.
  with torch.no_grad():
    hf_text = reference.get_text_features(input_ids=torch_ids,
                                          attention_mask=torch_mask).pooler_output
    hf_image = reference.get_image_features(pixel_values=torch_pixels).pooler_output
    # CLIPModel's outputs carry the projected pooler_output; the towers' own are these.
    hf_text_tower = reference.text_model(input_ids=torch_ids, attention_mask=torch_mask)
    hf_vision_tower = reference.vision_model(pixel_values=torch_pixels)
  _close(text.embeds, hf_text)
  _close(got["encode_text"], hf_text)
  _close(image.embeds, hf_image)
  _close(got["encode_image"], hf_image)
  _close(logits.logits_per_image, out.logits_per_image)
  _close(logits.logits_per_text, out.logits_per_text)
  _close(logits.text_embeds, out.text_embeds)
  _close(logits.image_embeds, out.image_embeds)
  assert logits.logits_per_image.shape == (2, 3)

  # Token states the verification model reads. The text ones are after the final LN.
  _close(text.hidden, out.text_model_output.last_hidden_state)
  _close(text.pooled, hf_text_tower.pooler_output)
  # Vision: HF's post_layernorm touches only the pooled CLS, so the encoder output is both
  # last_hidden_state and hidden_states[-1]; our patches are that without the CLS token.
  vision_out = out.vision_model_output
  torch.testing.assert_close(vision_out.hidden_states[-1], vision_out.last_hidden_state,
                             rtol=0, atol=0)
  assert image.patches.shape == (2, (IMAGE // 8) ** 2, 48)
  _close(image.patches, vision_out.hidden_states[-1][:, 1:])
  _close(image.hidden, vision_out.last_hidden_state)
  _close(image.pooled, hf_vision_tower.pooler_output)
  # The post-LN really changes the states, so "before post-LN" is a checked choice.
  post = reference.vision_model.post_layernorm(vision_out.last_hidden_state[:, 1:]).detach()
  assert np.abs(np.asarray(image.patches) - post.numpy()).max() > 10 * ATOL


def test_padding_does_not_leak_into_real_tokens(ours):
  # The same 7-token text twice, with different ids in its 5 padded positions.
  ids, mask = _texts(padded=True)
  ids[2], mask[2] = ids[1], mask[1]
  ids[2, 7:] = np.arange(5) + 40
  text = _everything(ours, ids, mask, _pixels())["text"]
  np.testing.assert_allclose(text.hidden[2, :7], text.hidden[1, :7], atol=ATOL)
  np.testing.assert_allclose(text.embeds[2], text.embeds[1], atol=ATOL)
  assert np.abs(np.asarray(text.hidden[2, 7:] - text.hidden[1, 7:])).max() > ATOL


def test_legacy_eos_id_pools_at_the_highest_id(checkpoint, tmp_path):
  # Configs from before transformers PR #24773 say eos_token_id=2; HF then pools at
  # argmax(input_ids). Same weights, only the config differs.
  folder, _ = checkpoint
  legacy = str(tmp_path / "legacy")
  shutil.copytree(folder, legacy)
  with open(os.path.join(legacy, "config.json")) as f:
    raw = json.load(f)
  raw["text_config"]["eos_token_id"] = 2
  with open(os.path.join(legacy, "config.json"), "w") as f:
    json.dump(raw, f)
  reference = transformers.CLIPModel.from_pretrained(legacy).eval()
  ids, mask = _texts()
  # Legacy texts: no id 98 (our config's EOS) and the highest id (97) mid-row, so the
  # legacy rule (argmax of ids) and the current one (first id 98, else position 0) differ.
  ids[ids == EOS] = 2
  ids[:, 0] = 1
  ids[0, 4] = ids[1, 5] = ids[2, 1] = BOS
  with torch.no_grad():
    expected = reference.get_text_features(input_ids=torch.from_numpy(ids),
                                           attention_mask=torch.from_numpy(mask)).pooler_output
  encode = nnx.jit(lambda model, ids, mask: model.encode_text(ids, mask))
  _close(encode(hf_clip.load(legacy), ids, mask), expected)
  default = encode(hf_clip.load(folder), ids, mask)
  assert np.abs(np.asarray(default) - expected.numpy()).max() > 10 * ATOL


def test_export_round_trip_loads_in_transformers(checkpoint, ours, tmp_path):
  folder, reference = checkpoint
  out = str(tmp_path / "export")
  hf_clip.save(ours, out)
  exported = convert.read_state_dict(out)
  original = {k: v for k, v in convert.read_state_dict(folder).items()
              if not k.endswith("position_ids")}
  assert exported.keys() == original.keys()
  for key, value in original.items():
    np.testing.assert_array_equal(exported[key], value, err_msg=key)
  reloaded = transformers.CLIPModel.from_pretrained(out).eval()
  ids, mask = _texts()
  pixels = _pixels()
  a = _torch_run(reference, ids, mask, pixels)
  b = _torch_run(reloaded, ids, mask, pixels)
  torch.testing.assert_close(b.logits_per_image, a.logits_per_image, rtol=0, atol=0)
  assert reloaded.config.text_config.eos_token_id == EOS
  again = _everything(hf_clip.load(out), ids, mask, pixels)["encode_image"]
  np.testing.assert_array_equal(again, _everything(ours, ids, mask, pixels)["encode_image"])


def test_config_round_trip_and_defaults():
  config = clip.CLIPConfig.from_hf(_hf_config().to_dict())
  assert config.text.hidden_size == 32 and config.vision.patch_size == 8
  assert config.vision.num_patches == 16 and config.projection_dim == 24
  assert clip.CLIPConfig.from_hf(config.to_hf()) == config
  # Absent towers take HF's defaults (ViT-B/32).
  default = clip.CLIPConfig.from_hf({"model_type": "clip"})
  hf_default = transformers.CLIPConfig()
  assert default.vision.hidden_size == hf_default.vision_config.hidden_size == 768
  assert default.text.eos_token_id == hf_default.text_config.eos_token_id


def _write_config(folder, raw):
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump(raw, f)


def test_errors_name_the_file_and_the_problem(checkpoint, tmp_path):
  folder, _ = checkpoint
  good = json.load(open(os.path.join(folder, "config.json")))

  no_weights = str(tmp_path / "no_weights")
  _write_config(no_weights, good)
  with pytest.raises(MochegInputError, match=f"{no_weights}: no weights found"):
    hf_clip.load(no_weights)

  with pytest.raises(MochegInputError, match="config.json: missing file"):
    hf_clip.load(str(tmp_path / "empty"))

  wrong_type = str(tmp_path / "wrong_type")
  _write_config(wrong_type, {**good, "model_type": "siglip"})
  with pytest.raises(MochegInputError, match=r"wrong_type/config.json: model_type 'siglip'"):
    hf_clip.load(wrong_type)

  bad_act = dict(good, text_config=dict(good["text_config"], hidden_act="swish"))
  with pytest.raises(MochegInputError, match=r"text_config.hidden_act: unsupported .*'swish'"):
    clip.CLIPConfig.from_hf(bad_act)
  bad_eos = dict(good, text_config=dict(good["text_config"], eos_token_id=[98, 3]))
  with pytest.raises(MochegInputError, match="text_config.eos_token_id"):
    clip.CLIPConfig.from_hf(bad_eos)
  bad_tower = dict(good, vision_config=dict(good["vision_config"], model_type="bert"))
  with pytest.raises(MochegInputError, match="vision_config.model_type"):
    clip.CLIPConfig.from_hf(bad_tower)

  from safetensors.numpy import save_file
  state = convert.read_state_dict(folder)
  state["text_projection.weight"] = np.zeros((24, 31), np.float32)
  del state["vision_model.post_layernorm.bias"]
  state["vision_model.extra.weight"] = np.zeros((3,), np.float32)
  broken = str(tmp_path / "broken")
  _write_config(broken, good)
  save_file(state, os.path.join(broken, "model.safetensors"))
  with pytest.raises(MochegInputError) as e:
    hf_clip.load(broken)
  message = str(e.value)
  assert message.startswith(broken)
  assert "text_projection.weight (24, 31) -> text_projection.kernel (32, 24)" in message
  assert "missing weights ['vision_model.post_layernorm.bias']" in message
  assert "unexpected weights ['vision_model.extra.weight']" in message


def test_dont_load_keeps_a_fresh_parameter(checkpoint, tmp_path):
  folder, _ = checkpoint
  from safetensors.numpy import save_file
  state = convert.read_state_dict(folder)
  del state["logit_scale"]
  partial = str(tmp_path / "partial")
  shutil.copytree(folder, partial)
  save_file(state, os.path.join(partial, "model.safetensors"))
  model = hf_clip.load(partial, dont_load=r"^logit_scale$")
  np.testing.assert_allclose(model.logit_scale[...], 2.3, rtol=1e-6)  # logit_scale_init_value


def test_every_parameter_has_logical_axes(ours):
  for path, variable in convert.params_by_path(ours).items():
    axes = variable.get_metadata().get("out_sharding")
    assert axes is not None and len(axes) == variable.get_value().ndim, path


def test_sharded_on_8_devices_matches_unsharded(ours):
  # Parameters placed by their logical axes (heads over "tensor"), activations constrained
  # by logical names (batch over "data"): the same numbers as on one device.
  auto = jax.sharding.AxisType.Auto
  mesh = jax.make_mesh((2, 4), ("data", "tensor"), axis_types=(auto, auto))
  names = {name for variable in convert.params_by_path(ours).values()
           for name in variable.get_metadata()["out_sharding"]}
  rules = [("batch", "data"), ("heads", "tensor")]
  rules += [(name, None) for name in sorted(names - {"heads"})]  # nnx needs every name.
  graphdef, state = nnx.split(ours)
  with nnx.logical_axis_rules(rules):
    shardings = nnx.get_named_sharding(state, mesh)
  state = jax.device_put(state, shardings)
  ids, mask = _texts()
  ids, mask = np.concatenate([ids, ids[:1]]), np.concatenate([mask, mask[:1]])  # 4 rows
  pixels = _pixels()

  @jax.jit
  def run(state, ids, mask, pixels):
    model = nnx.merge(graphdef, state)
    return model(ids, mask, pixels), model.text_features(ids, mask).hidden

  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    (sharded, hidden) = run(state, ids, mask, pixels)
  query = state["vision_model"]["layers"][0]["attention"]["query"]["kernel"].get_value()
  assert query.sharding.spec == jax.sharding.PartitionSpec(None, "tensor", None)
  assert hidden.sharding.spec[0] == "data"
  single = _everything(ours, ids, mask, pixels)
  np.testing.assert_allclose(sharded.logits_per_text, single["out"].logits_per_text, atol=1e-5)
  np.testing.assert_allclose(hidden, single["text"].hidden, atol=1e-5)


def test_bfloat16_smoke(checkpoint, ours):
  model = hf_clip.load(checkpoint[0], dtype=jnp.bfloat16)
  ids, mask = _texts()
  pixels = _pixels()
  fast, patches = nnx.jit(lambda m, ids, mask, px: (m(ids, mask, px), m.image_features(px).patches)
                          )(model, ids, mask, pixels)
  assert patches.dtype == jnp.bfloat16
  exact = _everything(ours, ids, mask, pixels)["out"]
  assert model.vision_model.patch_embedding.kernel[...].dtype == jnp.float32
  assert np.isfinite(np.asarray(fast.logits_per_image)).all()
  np.testing.assert_allclose(fast.logits_per_image, exact.logits_per_image, atol=0.1)
  cosine = np.sum(np.asarray(fast.image_embeds) * np.asarray(exact.image_embeds), -1)
  assert cosine.min() > 0.99


# ---- preprocessing: our decode_image against transformers' CLIP image processor ------------
def _processor(size: int):
  from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
  return CLIPImageProcessorPil(size={"shortest_edge": size},
                               crop_size={"height": size, "width": size})


# Sizes where rounding and truncating the resized long edge disagree are included on
# purpose: HF truncates, and a rounding resize would land one pixel off.
_IMAGE_SIZES = [
    (300, 200, 224), (457, 123, 224), (80, 50, 224), (333, 1001, 224), (224, 224, 224),
    (96, 61, 32), (640, 480, 224), (225, 301, 224), (1000, 333, 224),
]


@pytest.mark.parametrize("width,height,size", _IMAGE_SIZES)
def test_decode_image_matches_clip_image_processor(width, height, size):
  rng = np.random.default_rng(width * height)
  # Smooth content plus noise: resampling errors show without being only noise.
  yy, xx = np.mgrid[0:height, 0:width]
  base = 127 + 100 * np.sin(xx / 9.0)[..., None] * np.cos(yy / 13.0)[..., None]
  array = np.clip(base + rng.normal(0, 20, (height, width, 3)), 0, 255).astype(np.uint8)
  buffer = io.BytesIO()
  Image.fromarray(array).save(buffer, format="PNG")
  ours = vision.decode_image(buffer.getvalue(), size)
  reference = _processor(size)(Image.fromarray(array), return_tensors="np")["pixel_values"][0]
  reference = reference.transpose(1, 2, 0)  # HF is channels-first.
  assert ours.shape == reference.shape == (size, size, 3)
  # Same PIL bicubic on the same uint8 image: equal up to float rounding, when the resized
  # size agrees.
  np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=0)
