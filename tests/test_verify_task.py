"""The verification task on the tiny world: training through the shared trainer on a random
frozen CLIP's features, every evidence mode, and scripts/verify.py with gold and system
evidence."""

from __future__ import annotations

import collections
import csv
import json
import pathlib
import subprocess

import jax
import numpy as np
import pytest
from flax import nnx

from mocheg_jax.data.mocheg import MochegRelease
from mocheg_jax.data.report import MochegInputError
from mocheg_jax.retrieval import results as results_lib
from mocheg_jax.train import loop
from mocheg_jax.train.restore import load_trained
from mocheg_jax.train.writer import read_metrics
from mocheg_jax.utils.configs import load_config
from mocheg_jax.verification import ablations
from mocheg_jax.verification import evidence as evidence_lib
from mocheg_jax.verification import stance
from mocheg_jax.verification import task as verify_task
from tests.processes import run_script

REPO = pathlib.Path(__file__).resolve().parents[1]


def _config(data_dir, features_dir, **verify):
  config = load_config("verify", "tiny")
  config.data.dir = str(data_dir)  # One prepared world for every run of this file.
  config.verify.features_dir = str(features_dir)  # One feature store too.
  config.total_steps, config.eval_every, config.checkpoint_every = 30, 15, 15
  config.mesh.data = 1
  for key, value in verify.items():
    config.verify[key] = value
  return config


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  root = tmp_path_factory.mktemp("verify")
  config = _config(root / "data", root / "features")
  result = loop.train(config, str(root / "both"), devices=jax.devices()[:1],
                      log=lambda _: None)
  return root, result


def test_trains_and_selects_by_dev_macro_f1(trained):
  root, result = trained
  assert result.status == "finished" and result.step == 30
  records = read_metrics(root / "both")
  losses = [r["loss"] for r in records if "loss" in r]
  assert losses[-1] < losses[0]  # It learns (the training claims at least).
  evals = [r for r in records if "dev/macro_f1" in r]
  assert [r["step"] for r in evals] == [15, 30]
  model = load_trained(str(root / "both")).model
  assert isinstance(model, stance.StanceDetector)
  assert model.config.use_text and model.config.use_image


@pytest.mark.parametrize("mode, kind", [
    (dict(use_image=False), "text"), (dict(use_text=False), "image"),
    (dict(use_text=False, use_image=False), "none")])
def test_every_evidence_mode_is_a_config_switch(trained, tmp_path, mode, kind):
  root, _ = trained
  config = _config(root / "data", root / "features", **mode)
  config.total_steps, config.eval_every = 4, 4
  result = loop.train(config, str(tmp_path), devices=jax.devices()[:1], log=lambda _: None)
  assert result.status == "finished" and 0 <= result.metrics["dev/macro_f1"] <= 1
  model = load_trained(str(tmp_path)).model
  if kind == "none":
    assert isinstance(model, stance.ClaimOnlyClassifier)
  else:
    assert (model.config.use_text, model.config.use_image) == (kind == "text",
                                                                kind == "image")


def test_match_bits_max_pooling_word_queries_and_item_gates_train_and_predict(trained,
                                                                              tmp_path):
  root, _ = trained
  config = _config(root / "data", root / "features", token_match=True, phrase_match=True,
                   item_pool="max", image_query="words", item_gate=True, image_gate=True)
  config.total_steps, config.eval_every = 4, 4
  result = loop.train(config, str(tmp_path), devices=jax.devices()[:1], log=lambda _: None)
  assert result.status == "finished" and 0 <= result.metrics["dev/macro_f1"] <= 1
  trained_run = load_trained(str(tmp_path))
  model = trained_run.model
  assert model.config.token_match and model.config.item_pool == "max"
  assert model.match_fuse is not None and model.config.image_query == "words"
  assert model.config.phrase_match and model.phrase_fuse is not None
  # The gate trained with its auxiliary loss (gold evidence: every item relevant).
  assert model.item_gate is not None and 0 < result.metrics["item_relevance_loss"] < 1
  assert model.image_gate is not None and 0 < result.metrics["image_relevance_loss"] < 1
  assert 0 <= result.metrics["image_gate_accuracy"] <= 1
  assert np.abs(np.asarray(model.word_embedding.embedding[...])).max() > 0
  verifier = trained_run.task.inference
  dev = verifier.evidence("val")
  probabilities = verifier.predict(model, dev)
  assert probabilities.shape == (len(dev), 3)
  np.testing.assert_allclose(probabilities.sum(1), 1.0, atol=1e-5)


@pytest.mark.parametrize("option", ["image_score", "image_embeds"])
def test_image_embedding_options_build_a_store_with_embeddings_and_train(trained, tmp_path,
                                                                          option):
  root, _ = trained
  features_dir = tmp_path / "features"  # They need CLIP's embeddings in the store.
  config = _config(root / "data", features_dir, **{option: True})
  config.total_steps, config.eval_every = 4, 4
  result = loop.train(config, str(tmp_path / "run"), devices=jax.devices()[:1],
                      log=lambda _: None)
  assert result.status == "finished" and 0 <= result.metrics["dev/macro_f1"] <= 1
  trained_run = load_trained(str(tmp_path / "run"))
  layer = {"image_score": "score_fuse", "image_embeds": "embed_fuse"}[option]
  assert getattr(trained_run.model.config, option)
  assert getattr(trained_run.model, layer) is not None
  verifier = trained_run.task.inference
  dev = verifier.evidence("val")
  assert verifier.store(dev).manifest.embed_dim > 0
  assert verifier.predict(trained_run.model, dev).shape == (len(dev), 3)


def _system_rows(release: MochegRelease, splits: tuple[str, ...]
                 ) -> list[results_lib.RetrievedEvidence]:
  """Result-CSV rows for the claims of `splits`: each claim gets KB sentences and images
  that are not its own (3 and 2, cycling through the KB's first 50 sentences)."""
  sentences = [s for _, s in zip(range(50), release.iter_sentences())]
  images = release.kb_images()
  claims = [c for split in splits for c in release.claims(split)]
  return [results_lib.RetrievedEvidence(
      c.claim_id, text_ids=tuple(s.corpus_id for s in sentences[i % 47:i % 47 + 3]),
      texts=tuple(s.text for s in sentences[i % 47:i % 47 + 3]), text_scores=(3.0, 2.0, 1.0),
      images=tuple(images[i % (len(images) - 1):i % (len(images) - 1) + 2]),
      image_scores=(2.0, 1.0)) for i, c in enumerate(claims)]


def test_trained_on_system_evidence_also_with_the_gold(trained, tmp_path):
  """verify.train_also_gold: each train claim comes with its system and its gold evidence;
  the dev claims (model selection) keep the system evidence."""
  root, _ = trained
  release = MochegRelease(root / "data" / "release")
  result_csv = tmp_path / "results.csv"
  results_lib.write_results(result_csv, _system_rows(release, ("train", "val")))
  config = _config(root / "data", tmp_path / "features", evidence=str(result_csv),
                   item_gate=True, train_also_gold=True)
  config.total_steps, config.eval_every = 4, 4
  task = verify_task.make_task(config, str(tmp_path / "run"))
  train_claims = release.claims("train")
  batch = 16
  epoch = [b for _, b in zip(range(2 * len(train_claims) // batch), task.train_data(batch))]
  ids = np.concatenate([b["claim_id"] for b in epoch])
  counts = collections.Counter(ids.tolist())
  assert set(counts) <= {c.claim_id for c in train_claims}
  assert max(counts.values()) == 2  # Within one epoch: at most twice, some twice.
  # A claim's two examples differ: the gold one's items are all relevant to the gate.
  has_gold_text = {c.claim_id for c in train_claims if evidence_lib.evidence_sentences(
      c.evidence)}
  twice = next(i for i, n in counts.items() if n == 2 and i in has_gold_text)
  rows = [(b, j) for b in epoch for j in np.nonzero(b["claim_id"] == twice)[0]]
  relevant = sorted(float(b["text_relevant"][j][b["text_mask"][j].any(-1)].mean())
                    for b, j in rows)
  assert relevant == [0.0, 1.0]  # Its system sentences are other claims'.
  result = loop.train(config, str(tmp_path / "run"), devices=jax.devices()[:1],
                      log=lambda _: None)
  assert result.status == "finished" and 0 < result.metrics["item_relevance_loss"] < 1

  gold_config = _config(root / "data", tmp_path / "features", train_also_gold=True)
  with pytest.raises(MochegInputError, match="train_also_gold adds the gold evidence to "
                     "system evidence"):
    verify_task.make_task(gold_config, str(tmp_path / "gold_run"))


def _script(*args: str) -> subprocess.CompletedProcess:
  return run_script(REPO / "scripts" / "verify.py", *args, timeout_s=600)  # One CPU device.


def _read(path):
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def test_verify_script_with_gold_and_system_evidence(trained, tmp_path):
  root, _ = trained
  workdir = root / "both"
  release = MochegRelease(root / "data" / "release")
  test_claims = release.claims("test")
  gold_out = tmp_path / "gold.csv"
  proc = _script(f"--checkpoint={workdir}", "--split=test", f"--out={gold_out}")
  assert proc.returncode == 0, proc.stderr
  report = json.loads(proc.stdout.strip().splitlines()[-1])
  rows = _read(gold_out)
  assert [int(r["claim_id"]) for r in rows] == [c.claim_id for c in test_claims]
  assert report["claims"] == len(rows) and 0 <= report["macro_f1"] <= 1
  for row in rows:
    p = np.array([float(row[k]) for k in ("p_refuted", "p_supported", "p_nei")])
    assert abs(p.sum() - 1) < 1e-4
    assert row["label"] == ("refuted", "supported", "NEI")[int(p.argmax())]

  # System evidence: a result CSV holding other claims' KB sentences and images.
  rows_in = _system_rows(release, ("test",))
  result_csv = tmp_path / "results.csv"
  results_lib.write_results(result_csv, rows_in)
  system_out = tmp_path / "system.csv"
  ablations_out = tmp_path / "ablations.json"
  proc = _script(f"--checkpoint={workdir}", "--split=test", f"--evidence={result_csv}",
                 f"--out={system_out}", f"--ablations={ablations_out}")
  assert proc.returncode == 0, proc.stderr
  assert len(_read(system_out)) == len(test_claims)
  assert _read(system_out) != rows  # Other evidence, other probabilities.
  # The ablation table: every variant for a text+image model on system evidence, the first
  # the evidence as given (the script's own score), printed before the summary line.
  report = json.loads(proc.stdout.strip().splitlines()[-1])
  table = json.loads(ablations_out.read_text())
  assert [r["ablation"] for r in table["rows"]] == list(ablations.ABLATIONS)
  assert round(table["rows"][0]["macro_f1"], 4) == report["macro_f1"]
  assert all(sum(r[f"claims/{n}"] for n in ("refuted", "supported", "NEI"))
             == len(test_claims) for r in table["rows"])
  assert "| no images |" in proc.stdout

  # Bad input: claims missing from the CSV, a workdir that is not a verifier.
  results_lib.write_results(result_csv, rows_in[1:])
  proc = _script(f"--checkpoint={workdir}", "--split=test", f"--evidence={result_csv}",
                 f"--out={tmp_path / 'x.csv'}")
  assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
  assert str(test_claims[0].claim_id) in proc.stderr and not (tmp_path / "x.csv").exists()


def test_average_similarity_baseline_handles_claims_without_evidence(trained):
  from mocheg_jax.train.data import prepared_data
  from mocheg_jax.verification import stage
  from mocheg_jax.verification import task as verify_task
  from mocheg_jax.verification.evidence import ClaimEvidence
  root, _ = trained
  config = _config(root / "data", root / "features")
  data = prepared_data(config, str(root / "both"))
  frozen = verify_task.load_clip(config.verify, data.wordpiece, 0)
  image = MochegRelease(data.release).kb_images()[0]
  claims = [ClaimEvidence(1, "a claim", 0, ("a claim", "other words"),
                          (MochegRelease(data.release).image_path(image),)),
            ClaimEvidence(2, "a claim without evidence", 2, (), ())]
  scores = stage._average_similarity(frozen, claims, 32)  # pylint: disable=protected-access
  assert scores.shape == (2,) and scores[1] == 0.0 and -1 <= scores[0] <= 1


def test_text_states_from_a_frozen_sentence_encoder(trained, tmp_path):
  """verify.text_encoder=minilm: claims and text items through the packaged MiniLM (384-d
  last hidden states), images through CLIP; the store holds exactly MiniLM's states."""
  from mocheg_jax.data.tokenizers import minilm_dir
  from mocheg_jax.models import sentence_transformers as st
  from mocheg_jax.verification import features
  root, _ = trained
  config = _config(root / "data", tmp_path / "features", text_encoder="minilm")
  config.total_steps, config.eval_every = 4, 4
  result = loop.train(config, str(tmp_path / "w"), devices=jax.devices()[:1],
                      log=lambda _: None)
  assert result.status == "finished"
  model = load_trained(str(tmp_path / "w")).model
  assert (model.config.text_dim, model.config.image_dim) == (384, 64)
  store = features.open_store(tmp_path / "features")
  assert store.manifest.fingerprint["text_encoder"] == "minilm"
  claim = MochegRelease(root / "data" / "release").claims("train")[0].claim
  states, mask = store.text([claim])
  minilm = st.load(str(minilm_dir()))
  tokens = minilm.tokenizer([claim], max_length=32, truncation=True, return_tensors="np")
  want = features.text_hidden_states(minilm.encoder, tokens["input_ids"],
                                     tokens["attention_mask"])
  n = int(tokens["attention_mask"].sum())
  assert mask[0].sum() == n
  np.testing.assert_allclose(states[0, :n].astype(np.float32), np.asarray(want)[0, :n],
                             atol=2e-2, rtol=2e-2)
  # A store is tied to its encoders: the CLIP-text store of this file refuses MiniLM runs.
  config.verify.features_dir = str(root / "features")
  with pytest.raises(MochegInputError, match=r"encoded by another model \(text_encoder: store "
                     r"has None, asked for .minilm.\)"):
    loop.train(config, str(tmp_path / "w2"), devices=jax.devices()[:1], log=lambda _: None)


def test_tuned_vision_blocks_train_from_the_clip(trained, tmp_path):
  """verify.tune_vision_layers=1: the store caches the tokens entering the CLIP's last vision
  block (class token included), that block starts from the CLIP's weights and trains."""
  from mocheg_jax.train.data import prepared_data
  from mocheg_jax.verification import features, vision_top
  from mocheg_jax.verification import task as verify_task
  root, _ = trained
  config = _config(root / "data", tmp_path / "features", tune_vision_layers=1)
  config.total_steps, config.eval_every = 4, 4
  result = loop.train(config, str(tmp_path / "w"), devices=jax.devices()[:1],
                      log=lambda _: None)
  assert result.status == "finished" and 0 <= result.metrics["dev/macro_f1"] <= 1
  model = load_trained(str(tmp_path / "w")).model
  assert isinstance(model, vision_top.TunedVisionStance)
  frozen = verify_task.load_clip(config.verify, prepared_data(config, str(root)).wordpiece, 0)
  vision = frozen.model.config.vision
  manifest = features.open_store(tmp_path / "features").manifest
  assert manifest.fingerprint["tune_vision_layers"] == 1
  assert manifest.patches == vision.num_patches + 1
  # Four Adam steps at lr 1e-3 move each weight by at most ~4e-3: the block started from the
  # CLIP's last one (a fresh init would be off by far more) and did move.
  start = nnx.to_pure_dict(nnx.state(frozen.model.vision_model.layers[-1], nnx.Param))
  now = nnx.to_pure_dict(nnx.state(model.vision_top.layers[0], nnx.Param))
  gaps = [float(np.abs(np.asarray(a) - np.asarray(b)).max())
          for a, b in zip(jax.tree.leaves(start), jax.tree.leaves(now))]
  assert max(gaps) < 5e-3 and max(gaps) > 0
  # A store built without tuning is refused by a tuned run (different fingerprint).
  config.verify.features_dir = str(root / "features")
  with pytest.raises(MochegInputError, match="tune_vision_layers"):
    loop.train(config, str(tmp_path / "w2"), devices=jax.devices()[:1], log=lambda _: None)
