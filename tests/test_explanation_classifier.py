"""The truthfulness classifier (the REINFORCE reward model): model, reward, the task on the
tiny world through the shared trainer, and loading a trained one back."""

from __future__ import annotations

import csv

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flax import traverse_util

from mocheg_jax.data import prepare as prepare_lib
from mocheg_jax.data.mocheg import MochegRelease
from mocheg_jax.data.report import MochegInputError, SkipReport
from mocheg_jax.explanation import classifier as cl
from mocheg_jax.explanation import classifier_task as ct
from mocheg_jax.metrics.classification import classification_report
from mocheg_jax.models import bart, bert
from mocheg_jax.train import loop
from mocheg_jax.train.writer import read_metrics
from mocheg_jax.utils.configs import load_config
from mocheg_jax.verification import stance
from tests import release_fixture

VOCAB = 61
_probabilities = nnx.jit(cl.label_probabilities)  # One compile per model shape and input.


def _arch(body: str, pooling: str = "mean", **head) -> cl.ClassifierConfig:
  if body == "bart_encoder":
    encoder = bart.BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=0,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
        decoder_ffn_dim=48, max_position_embeddings=40, dropout=0.1)
  else:
    encoder = bert.BertConfig(vocab_size=VOCAB, hidden_size=24, num_hidden_layers=2,
                              num_attention_heads=4, intermediate_size=40,
                              max_position_embeddings=40)
  return cl.ClassifierConfig(body, encoder, pooling, **head)


def _model(config: cl.ClassifierConfig, seed: int = 0) -> cl.TruthfulnessClassifier:
  """A classifier with numpy-drawn weights, built abstractly: no per-shape random-op
  compiles (most of a small model's eager construction time); the trainer's jitted
  initialisation is exercised by the task tests below."""
  abstract = nnx.eval_shape(lambda: cl.TruthfulnessClassifier(config, rngs=nnx.Rngs(seed)))
  graphdef, params, rest = nnx.split(abstract, nnx.Param, ...)
  rng = np.random.default_rng(seed)
  params = jax.tree.map(lambda x: jnp.asarray(rng.normal(0, 0.2, x.shape), x.dtype), params)
  key = jax.random.key(seed)
  rest = jax.tree.map(lambda x: key if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
                      else jnp.zeros(x.shape, x.dtype), rest)
  return nnx.merge(graphdef, params, rest)


def _ids(batch: int = 4, length: int = 12, seed: int = 0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(3, VOCAB, (batch, length)).astype(np.int32)
  lengths = np.linspace(length, 2, batch).astype(int)
  mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
  return np.where(mask == 1, ids, 1), mask


@pytest.fixture(scope="module")
def models():
  return {"bart_encoder": _model(_arch("bart_encoder")),
          "bert": _model(_arch("bert", "pooler"))}


# ---- the model ------------------------------------------------------------------------------
@pytest.mark.parametrize("body, width", [("bart_encoder", 32), ("bert", 24)])
def test_shapes_and_head_sizes(models, body, width):
  model = models[body]
  ids, mask = _ids()
  logits = jax.eval_shape(lambda i, m: model(i, m), ids, mask)
  assert logits.shape == (4, 3) and logits.dtype == jnp.float32
  probs = np.asarray(_probabilities(model, ids, mask))
  assert probs.shape == (4, 3)
  np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
  # The reference's head: D -> 128 -> 16 -> 3.
  assert [fc.kernel.shape for fc in model.head.fcs] == [(width, 128), (128, 16), (16, 3)]
  if body == "bert":  # Pooler output when asked for; a masked-mean body builds none.
    assert model.body.pooler is not None
    mean = nnx.eval_shape(lambda: cl.TruthfulnessClassifier(_arch("bert", "mean"),
                                                            rngs=nnx.Rngs(0)))
    assert mean.body.pooler is None


def test_head_is_the_references_order_and_slope():
  """Dense -> LeakyReLU(0.1) -> Dropout -> Dense -> LeakyReLU(0.1) -> Dropout -> Dense,
  kernels drawn as torch.nn.Linear's default (|w| <= 1/sqrt(fan_in))."""
  head = cl.TruthfulnessHead(8, 3, sizes=(6, 4), rngs=nnx.Rngs(0))
  for fc in head.fcs:
    bound = 1 / np.sqrt(fc.kernel.shape[0])
    assert np.abs(np.asarray(fc.kernel[...])).max() <= bound
  rng = np.random.default_rng(1)
  for fc in head.fcs:
    fc.bias[...] = jnp.asarray(rng.normal(size=fc.bias.shape), jnp.float32)
  x = rng.normal(size=(5, 8)).astype(np.float32)
  want = x
  for i, fc in enumerate(head.fcs):
    want = want @ np.asarray(fc.kernel[...]) + np.asarray(fc.bias[...])
    if i < 2:
      want = np.where(want > 0, want, 0.1 * want)
  call = nnx.jit(lambda head, x, deterministic: head(x, deterministic=deterministic),
                 static_argnums=2)
  np.testing.assert_allclose(np.asarray(call(head, x, True)), want, rtol=1e-5, atol=1e-5)
  assert not np.allclose(np.asarray(call(head, x, False)), want)  # Dropout when training.


def test_padding_does_not_change_the_probabilities(models):
  model = models["bart_encoder"]
  ids, mask = _ids(length=12)
  longer_ids = np.concatenate([ids, np.full((4, 8), 7, np.int32)], axis=1)  # Junk, masked.
  longer_mask = np.concatenate([mask, np.zeros((4, 8), np.int32)], axis=1)
  np.testing.assert_allclose(np.asarray(_probabilities(model, ids, mask)),
                             np.asarray(_probabilities(model, longer_ids, longer_mask)),
                             atol=1e-5)
  with pytest.raises(ValueError, match="exceeds"):  # 48 > 40 positions: never clamped.
    jax.eval_shape(lambda i, m: model(i, m), np.zeros((1, 48), np.int32),
                   np.ones((1, 48), np.int32))


def test_reward_on_hand_probabilities():
  p = jnp.asarray([[0.7, 0.2, 0.1]] * 3 + [[0.0, 0.0, 1.0]])
  labels = jnp.asarray([0, 1, 2, 2])
  want = [0.7 - 0.3, 0.2 - 0.8, 0.1 - 0.9, 1.0]
  np.testing.assert_allclose(np.asarray(jax.jit(cl.reward)(p, labels)), want, atol=1e-6)


def test_reward_is_computed_inside_one_jit_on_sampled_ids(models):
  """Sampling, classifying and rewarding in one jitted function (no host round trip), equal
  to the eager calls on the same ids; one trace for repeated calls."""
  model = models["bart_encoder"]
  graphdef, state = nnx.split(model)
  traces = []

  @jax.jit
  def sample_and_reward(state, key, logits, labels):
    traces.append(1)
    ids = jax.random.categorical(key, logits).astype(jnp.int32)  # [B, L]
    lengths = jnp.asarray([12, 7, 3, 1])
    mask = jnp.arange(ids.shape[1])[None] < lengths[:, None]  # A bool mask works too.
    probs = cl.label_probabilities(nnx.merge(graphdef, state), ids, mask)
    return ids, mask, probs, cl.reward(probs, labels)

  logits = jax.random.normal(jax.random.key(0), (4, 12, VOCAB))
  labels = jnp.asarray([0, 1, 2, 0])
  for seed in (1, 2):
    ids, mask, probs, rewards = sample_and_reward(state, jax.random.key(seed), logits, labels)
    np.testing.assert_allclose(np.asarray(rewards),
                               2 * np.asarray(probs)[np.arange(4), labels] - 1, atol=1e-5)
  eager = cl.label_probabilities(model, ids, np.asarray(mask).astype(np.int32))
  np.testing.assert_allclose(np.asarray(probs), np.asarray(eager), atol=1e-5)
  assert len(traces) == 1


def test_bert_body_from_a_local_hf_folder_uses_its_pooler(tmp_path, one_torch_thread):
  """The paper path: an HF BERT folder's weights, pooled = its pooler output (torch)."""
  import torch
  import transformers
  torch.manual_seed(0)
  hf = transformers.BertModel(transformers.BertConfig(
      vocab_size=VOCAB, hidden_size=24, num_hidden_layers=2, num_attention_heads=4,
      intermediate_size=40, max_position_embeddings=40)).eval()
  hf.save_pretrained(tmp_path, safe_serialization=True)
  c = ct.classifier_config()
  c.body, c.init = "bert", str(tmp_path)
  source = ct.body_source(c, None)
  assert source.config.pooling == "pooler" and source.tokenizer_dir == str(tmp_path)
  model = _model(source.config)
  flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  for path, value in traverse_util.flatten_dict(source.weights()).items():
    flat[path].set_value(jnp.asarray(value))
  ids, mask = _ids(length=9)
  with torch.no_grad():
    want = hf(input_ids=torch.tensor(ids, dtype=torch.long),
              attention_mask=torch.tensor(mask, dtype=torch.long)).pooler_output.numpy()
  pooled = nnx.jit(lambda m, i, k: m.pooled(i, k))(model, ids, mask)
  np.testing.assert_allclose(np.asarray(pooled), want, atol=1e-4)
  c.pooling = "mean"  # Then no pooler is built and its weights are not poured in.
  source = ct.body_source(c, None)
  assert source.config.pooling == "mean" and "pooler" not in source.weights()["body"]


def test_bart_encoder_body_from_a_local_hf_folder(tmp_path, one_torch_thread):
  """An HF BART folder's encoder (a pretrained generator's) pours into the bart_encoder
  body by name; pooled = the masked mean of its encoder states (torch)."""
  import torch
  import transformers
  torch.manual_seed(0)
  hf = transformers.BartForConditionalGeneration(transformers.BartConfig(
      vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=1,
      encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
      decoder_ffn_dim=48, max_position_embeddings=40)).eval()
  hf.save_pretrained(tmp_path, safe_serialization=True)
  c = ct.classifier_config()
  c.init = str(tmp_path)
  source = ct.body_source(c, None)
  assert source.config.pooling == "mean" and source.config.features == 32
  model = _model(source.config)
  flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  poured = traverse_util.flatten_dict(source.weights())
  assert set(poured) == {p for p in flat if p[0] == "body"}  # Every body parameter.
  for path, value in poured.items():
    flat[path].set_value(jnp.asarray(value))
  ids, mask = _ids(length=9)
  with torch.no_grad():
    states = hf.model.encoder(input_ids=torch.tensor(ids, dtype=torch.long),
                              attention_mask=torch.tensor(mask, dtype=torch.long))
  m = mask[..., None]
  want = (states.last_hidden_state.numpy() * m).sum(1) / m.sum(1)
  pooled = nnx.jit(lambda m, i, k: m.pooled(i, k))(model, ids, mask)
  np.testing.assert_allclose(np.asarray(pooled), want, atol=1e-4)


def test_config_errors_name_the_field(tmp_path):
  c = ct.classifier_config()
  for field, value, message in [
      ("body", "gpt", "config.classifier.body"),
      ("pooling", "pooler", "pooling 'pooler' needs body 'bert'"),
      ("truncation_side", "middle", "config.classifier.truncation_side"),
      ("init", "minilm", "'minilm' needs body 'bert'"),
      ("init", str(tmp_path / "absent"), "is not a folder"),
      ("init", "", "config.classifier.init is empty")]:
    bad = ct.classifier_config()
    bad[field] = value
    with pytest.raises((ValueError, MochegInputError), match=message):
      ct.validate(bad)
  ct.validate(c)
  assert load_config("classifier", "paper").classifier.init == ""  # Must be passed.
  assert load_config("classifier", "small").classifier.hidden_size == 128
  with pytest.raises(ValueError, match="unknown variant"):
    load_config("classifier", "huge")


def test_paper_config_freezes_the_embeddings_and_the_first_layer():
  """The reference freezes bert-base's first 21 parameters: 5 of the embeddings and the 16
  of layer 0."""
  from mocheg_jax.train import state as state_lib
  config = load_config("classifier", "paper")
  model = nnx.eval_shape(lambda: cl.TruthfulnessClassifier(
      cl.ClassifierConfig("bert", bert.BertConfig(num_hidden_layers=2), "pooler"),
      rngs=nnx.Rngs(0)))
  params = nnx.state(model, nnx.Param).to_pure_dict()
  trainable, frozen = state_lib.split_by_regex(params, config.freeze)
  paths = [".".join(map(str, p)) for p in traverse_util.flatten_dict(frozen)]
  assert len(paths) == 21
  assert all(p.startswith(("body.embeddings.", "body.encoder.layers.0.")) for p in paths)
  assert "head" in trainable and "pooler" in trainable["body"]


def test_claims_without_an_explanation_are_skipped_and_counted(tmp_path):
  release_fixture.write_release(str(tmp_path))
  path = tmp_path / "train" / "Corpus2.csv"
  with open(path, "a", newline="", encoding="utf-8") as f:  # No outline, no ruling paragraph.
    csv.writer(f, lineterminator="\n").writerow(
        [6, "u6", "A claim.", "FALSE", "Ev.", "e7", "<p>No ruling here.</p>", "refuted", ""])
  report = SkipReport()
  out = ct.read_explanations(MochegRelease(str(tmp_path)), "train", report)
  assert out.skipped == 1 and 6 not in out.claim_ids
  assert set(out.claim_ids) == {1, 2, 4} and out.labels.tolist() == [1, 0, 2]
  assert out.texts[1].startswith("The photograph shows")  # From Origin's "Our ruling".
  assert [(r.reason, r.detail) for r in report.records] == [(ct.NO_EXPLANATION, "claim 6")]


# ---- the task on the tiny world -------------------------------------------------------------
def _config(data_dir, **classifier):
  config = load_config("classifier", "tiny")
  config.data.dir = str(data_dir)
  config.total_steps, config.eval_every, config.checkpoint_every = 60, 30, 30
  config.log_every = 10
  config.mesh.data = 1
  for key, value in classifier.items():
    config.classifier[key] = value
  return config


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  root = tmp_path_factory.mktemp("classifier")
  data = prepare_lib.prepare(str(root / "data"), scale="tiny", log=lambda _: None)
  return root, data


@pytest.fixture(scope="module")
def trained(world):
  """(workdir, TrainResult, the classifier loaded back from its latest checkpoint)."""
  root, _ = world
  workdir = root / "run"
  result = loop.train(_config(root / "data"), str(workdir), devices=jax.devices()[:1],
                      log=lambda _: None)
  return workdir, result, ct.load_classifier(str(workdir), "latest")


def test_trains_on_the_tiny_world(world, trained):
  _, data = world
  workdir, result, loaded = trained
  assert result.status == "finished" and result.step == 60
  records = read_metrics(workdir)
  losses = [r["loss"] for r in records if "loss" in r]
  assert losses[-1] < 0.5 * losses[0]
  assert [r["step"] for r in records if "dev/macro_f1" in r] == [30, 60]
  train = ct.read_explanations(MochegRelease(data.release), "train")
  predicted = loaded.predict(train.texts).argmax(-1)
  majority = np.full_like(train.labels, np.bincount(train.labels).argmax())
  f1 = classification_report(train.labels, predicted)["macro_f1"]
  baseline = classification_report(train.labels, majority)["macro_f1"]
  assert f1 > baseline + 0.3, (f1, baseline)


def test_load_classifier_round_trip(world, trained):
  root, data = world
  workdir, _, loaded = trained
  assert isinstance(loaded.model, cl.TruthfulnessClassifier) and loaded.step == 60
  assert loaded.inference.tokenizer_dir == data.bpe  # The generator's own tokenizer.
  loaded.check_reads_ids_of(prepare_lib.tokenizers.load_tokenizer(data.bpe))
  with pytest.raises(MochegInputError, match="cannot read its token ids"):
    loaded.check_reads_ids_of(prepare_lib.tokenizers.load_tokenizer(data.wordpiece))
  # The loaded weights are the evaluated ones: the last dev evaluation is reproduced.
  dev = ct.read_explanations(MochegRelease(data.release), "val")
  probs = loaded.predict(dev.texts)
  last = [r for r in read_metrics(workdir) if "dev/macro_f1" in r][-1]
  got = ct.scores(dev.labels, probs)
  assert got["macro_f1"] == pytest.approx(last["dev/macro_f1"])
  assert got["mean_reward"] == pytest.approx(last["dev/mean_reward"], abs=1e-5)
  np.testing.assert_allclose(  # The mean reward of the gold explanations, from `reward`.
      got["mean_reward"], np.mean(np.asarray(cl.reward(jnp.asarray(probs), dev.labels))),
      atol=1e-6)
  ids, mask, cut = loaded.inference.encode(dev.texts[:2])
  assert cut == 0 and (ids[:, 0] == loaded.tokenizer.bos_token_id).all()
  assert ids[0, mask[0].sum() - 1] == loaded.tokenizer.eos_token_id
  with pytest.raises(MochegInputError, match="not a training workdir"):
    ct.load_classifier(str(root / "nowhere"))


def test_class_weights_act_in_the_loss(world, trained):
  root, data = world
  task = ct.make_task(_config(root / "data"), str(root / "t"))
  train = ct.read_explanations(MochegRelease(data.release), "train")
  counts = np.bincount(train.labels, minlength=3)
  weights = np.asarray(task.inference.class_weights)
  np.testing.assert_allclose(weights, stance.class_weights(counts, 2.0), rtol=1e-6)
  assert np.argsort(weights).tolist() == np.argsort(-counts).tolist()  # Rarer: heavier.
  batch = next(iter(task.train_data(16)))
  assert len(set(batch["label"].tolist())) > 1
  model = nnx.clone(trained[2].model)
  model.head.dropout.rate = 0.0  # The loss runs in training mode: make it deterministic.
  value, logits = nnx.jit(lambda m, b: (task.loss(m, b)[0], m(b["ids"], b["mask"])))(
      model, batch)
  logp = np.asarray(jax.nn.log_softmax(logits))
  nll = -logp[np.arange(16), batch["label"]]
  w = weights[batch["label"]]
  np.testing.assert_allclose(float(value), (w * nll).sum() / w.sum(), rtol=1e-4)
  assert abs(float(value) - nll.mean()) > 1e-3 * nll.mean()  # The weights change the loss.


def test_long_explanations_are_cut_on_the_left(trained):
  inference = trained[2].inference
  tok = inference.tokenizer
  text = " ".join(f"word{i}" for i in range(400)) + " The claim is rated False."
  full = tok(text)["input_ids"]
  assert len(full) > inference.max_len
  ids, mask, cut = inference.encode([text, "Short."])
  assert cut == 1 and ids.shape[1] == inference.max_len and mask[0].all()
  assert ids[0].tolist() == [full[0], *full[len(full) - inference.max_len + 1:]]
  assert ids[0, -1] == tok.eos_token_id
  assert mask[1].sum() == len(tok("Short.")["input_ids"])


# ---- the reference's reward path: the classifier reads re-tokenised text ---------------------
def _text_classifier(data, max_len: int = 48) -> ct.TrainedClassifier:
  """A random BERT-body classifier over the world's WordPiece: another vocabulary than the
  generator's BPE, as the reference's bert-base-uncased is."""
  wordpiece = prepare_lib.tokenizers.load_tokenizer(data.wordpiece)
  encoder = bert.BertConfig(vocab_size=len(wordpiece), hidden_size=24, num_hidden_layers=2,
                            num_attention_heads=4, intermediate_size=40,
                            max_position_embeddings=64)
  model = _model(cl.ClassifierConfig("bert", encoder, "pooler"))
  inference = ct.ClassifierInference(tokenizer_dir=data.wordpiece, body="bert",
                                     max_len=max_len, truncation_side="left", batch_size=4)
  return ct.TrainedClassifier(model, inference, step=0, workdir="text-classifier")


def _generator_ids(tokenizer, texts, length: int):
  """BPE ids of `texts` as a sample holds them: no <s>, cut at `length`, pads masked."""
  rows = [tokenizer(t, add_special_tokens=False)["input_ids"][:length] for t in texts]
  ids = np.full((len(rows), length), tokenizer.pad_token_id, np.int32)
  mask = np.zeros((len(rows), length), bool)
  for i, r in enumerate(rows):
    ids[i, :len(r)], mask[i, :len(r)] = r, True
  return ids, mask


def test_text_reward_equals_the_host_classifier_on_the_decoded_samples(world):
  from mocheg_jax.explanation import text_reward
  _, data = world
  bpe = prepare_lib.tokenizers.load_tokenizer(data.bpe)
  classifier = _text_classifier(data)
  texts = [*ct.read_explanations(MochegRelease(data.release), "val").texts[:3], "", "Fine."]
  ids, mask = _generator_ids(bpe, texts, 40)  # The first rows are cut mid-text.
  ids[1, 5] = bpe.pad_token_id  # A masked-in pad: decoding skips it, as the reference.
  reward_model = text_reward.text_reward_model(classifier, bpe)
  labels = jnp.asarray([0, 1, 2, 1, 0])
  probs, rewards = jax.jit(lambda r, i, m: (r(i, m), r.reward(i, m, labels)))(
      reward_model, jnp.asarray(ids), jnp.asarray(mask))
  decoded = bpe.batch_decode([row[keep] for row, keep in zip(ids, mask)],
                             skip_special_tokens=True)
  assert decoded[4] == "Fine." and decoded[3] == ""
  expected = classifier.predict(decoded)
  np.testing.assert_allclose(np.asarray(probs), expected, atol=2e-6)
  np.testing.assert_allclose(np.asarray(rewards),
                             np.asarray(cl.reward(jnp.asarray(expected), labels)), atol=4e-6)
  assert np.ptp(expected[:, 0]) > 50 * 2e-6  # The rows differ beyond the tolerance.


def test_text_reward_inside_a_sharded_reinforce_step(world):
  """The callback runs inside the jitted, batch-sharded loss and its gradient; the greedy
  baseline (per-position argmax of the teacher-forced logits) it reports is the host
  classifier's reward of that decoded text."""
  from mocheg_jax.explanation import reinforce, text_reward
  _, data = world
  bpe = prepare_lib.tokenizers.load_tokenizer(data.bpe)
  classifier = _text_classifier(data)
  reward_model = text_reward.text_reward_model(classifier, bpe)
  generator = bart.Bart(bart.BartConfig(
      vocab_size=len(bpe), d_model=16, encoder_layers=1, decoder_layers=1,
      encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
      decoder_ffn_dim=32, max_position_embeddings=64, dropout=0.0), rngs=nnx.Rngs(0))
  texts = ct.read_explanations(MochegRelease(data.release), "val").texts[:4]
  source_ids, source_mask = _generator_ids(bpe, [f"refuted </s> {t}" for t in texts], 24)
  target_ids, target_mask = _generator_ids(bpe, texts, 16)
  labels = np.asarray([0, 1, 2, 1], np.int32)
  batch = {"source_ids": source_ids, "source_mask": source_mask.astype(np.int32),
           "target_ids": target_ids, "target_mask": target_mask.astype(np.int32),
           "label": labels}
  settings = reinforce.ReinforceSettings(sc_weight=0.5, start_step=0, baseline="greedy",
                                         teacher_forced_sampling=True, sample_max_length=16)
  mesh = jax.make_mesh((2,), ("data",), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:2])  # As the trainer's mesh.
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  batch = jax.device_put(batch, rows)

  @nnx.jit
  def step(model, batch, reward_model):
    def loss(model):
      return reinforce.explanation_loss(model, batch, step=jnp.int32(3),
                                        key=jax.random.key(1), settings=settings,
                                        reward_model=reward_model)
    return nnx.value_and_grad(loss, has_aux=True)(model)

  (value, metrics), grads = step(generator, batch, reward_model)
  assert np.isfinite(float(value)) and float(metrics["sc_weight"]) == 0.5
  assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))
  logits = reinforce.teacher_forced_logits(generator, jnp.asarray(source_ids),
                                           jnp.asarray(source_mask), jnp.asarray(target_ids),
                                           deterministic=True)
  greedy = np.where(target_mask, np.asarray(jnp.argmax(logits, -1)), target_ids)
  decoded = bpe.batch_decode([row[keep] for row, keep in zip(greedy, target_mask)],
                             skip_special_tokens=True)
  expected = cl.reward(jnp.asarray(classifier.predict(decoded)), jnp.asarray(labels))
  np.testing.assert_allclose(float(metrics["baseline"]), float(np.mean(expected)), atol=1e-5)


def test_text_reward_path_is_chosen_by_config(world, trained):
  """"ids" refuses a classifier of another tokenizer; "text" takes it; a typo is named."""
  from mocheg_jax.explanation import generator_task as gt
  _, data = world
  wordpiece = prepare_lib.tokenizers.load_tokenizer(data.wordpiece)
  workdir = str(trained[0])
  with pytest.raises(MochegInputError, match="reward_input=text"):
    gt.load_reward_model(workdir, wordpiece, 32, "ids")
  reward_model = gt.load_reward_model(workdir, wordpiece, 32, "text")
  ids, mask = _generator_ids(wordpiece, ["The claim is rated False."], 12)
  probs = jax.jit(lambda r, i, m: r(i, m))(reward_model, ids, mask)
  text = wordpiece.batch_decode([ids[0][mask[0]]], skip_special_tokens=True)
  np.testing.assert_allclose(np.asarray(probs), trained[2].predict(text), atol=2e-6)
  with pytest.raises(MochegInputError, match="reward_input 'txt'"):
    gt.load_reward_model(workdir, wordpiece, 32, "txt")
