"""The main job's explanation stage on the tiny world with hand-made system evidence and
labels: the classifier, both generators (the reward term on in one), Table 5's rows and files.
Models and step counts are shrunk further than the main job's tiny run (the full stage,
BERTScore included, runs in tests/test_workflow.py)."""

from __future__ import annotations

import csv
import json
import os

import jax
import numpy as np
import pytest

from mocheg_jax.data import prepare as prepare_lib
from mocheg_jax.data.mocheg import MochegRelease
from mocheg_jax.data.report import MochegInputError
from mocheg_jax.data.synthetic import write_world
from mocheg_jax.explanation import stage
from mocheg_jax.explanation import table5
from mocheg_jax.retrieval import results as results_lib
from mocheg_jax.train.checkpoint import Checkpointer
from mocheg_jax.train import loop
from mocheg_jax.train.loop import CHECKPOINT_DIR
from mocheg_jax.train.writer import read_metrics
from mocheg_jax.verification import predictions


def _small_classifier(*args, **kwargs):
  config = _ORIGINAL["classifier"](*args, **kwargs)
  config.total_steps, config.eval_every, config.checkpoint_every = 8, 8, 8
  config.optimizer.warmup_steps = 0
  c = config.classifier
  c.hidden_size, c.num_layers, c.num_heads, c.mlp_size, c.max_len = 16, 1, 2, 32, 64
  return config


def _small_generator(*args, **kwargs):
  config = _ORIGINAL["generator"](*args, **kwargs)
  config.total_steps, config.batch_size, config.log_every = 6, 8, 1  # 8 fake devices.
  config.eval_every, config.checkpoint_every = 6, 3  # Step 3: where the reward starts.
  config.optimizer.warmup_steps = 0
  e = config.explain
  e.d_model, e.layers, e.heads, e.ffn, e.max_positions = 16, 1, 2, 32, 64
  e.max_source_len, e.max_target_len = 48, 48
  e.sample_max_length, e.max_decode_length = 12, 12
  e.eval_batch_size, e.eval_max_claims, e.sc_start_step = 4, 4, 3
  return config


_ORIGINAL = {"classifier": stage.classifier_config, "generator": stage.generator_config}


@pytest.fixture(scope="module")
def stage_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("explanation_stage")
  # A release outside the workdir, as `run_pipeline.py --release=DIR` gives the stages.
  release_dir = str(tmp_path_factory.mktemp("release"))
  write_world(release_dir, scale="tiny", seed=0, progress=False)
  prepare_lib.prepare(str(workdir), release=release_dir, log=lambda _: None)
  inputs = dict(release=release_dir,  # And an override applied after the stage's own steps.
                overrides={"classifier": {"classifier.dropout": 0.125}})
  release = MochegRelease(release_dir)
  claims = release.claims("test")
  # System labels: every test claim but the first, the last one's label rotated.
  labels = [np.eye(3)[c.label] for c in claims[1:]]
  labels[-1] = np.eye(3)[(claims[-1].label + 1) % 3]
  predictions.write_predictions(str(workdir / stage.VERIFY_RESULTS),
                                [c.claim_id for c in claims[1:]], labels)
  with pytest.raises(MochegInputError, match="retrieval_results.csv: missing; the retrieval "
                     "stage writes it"):
    stage.run(str(workdir), "tiny", 0, log=lambda _: None, **inputs)
  # System evidence: the KB's first sentences, nothing retrieved for the first claim.
  sentences = [s for _, s in zip(range(40), release.iter_sentences())]
  results_lib.write_results(workdir / stage.RETRIEVAL_RESULTS, [
      results_lib.RetrievedEvidence(c.claim_id, tuple(s.corpus_id for s in sentences[i:i + 2]),
                                    tuple(s.text for s in sentences[i:i + 2]), (2.0, 1.0))
      if i else results_lib.RetrievedEvidence(c.claim_id) for i, c in enumerate(claims)])
  lines = []
  mp = pytest.MonkeyPatch()
  mp.setattr(stage, "classifier_config", _small_classifier)
  mp.setattr(stage, "generator_config", _small_generator)
  try:
    out = stage.run(str(workdir), "tiny", 0, log=lines.append, **inputs)
  finally:
    mp.undo()
  return workdir, claims, out, "\n".join(lines), inputs


def test_stage_trains_on_the_given_release_with_overrides(stage_run):
  workdir = stage_run[0]
  classifier = Checkpointer(str(workdir / "stages" / stage.CLASSIFIER_DIR / CHECKPOINT_DIR),
                            read_only=True)
  config = classifier.restore_config(classifier.latest_step())
  assert config["classifier"]["dropout"] == 0.125
  assert config["data"]["release"] == str(workdir.parent / "release0")
  assert not (workdir / "release").exists()  # No synthetic world was written.


def test_table5_rows_and_files(stage_run):
  workdir, claims, out, text, _ = stage_run
  rows = out["rows"]
  generated = {(r["system"], r["evidence"], r["label"]) for r in rows if r["label"] != "-"}
  assert generated == {(s, e, l) for s in stage.GENERATORS for e in ("gold", "system")
                       for l in ("gold", "system")}
  baselines = [(r["system"], r["evidence"]) for r in rows if r["label"] == "-"]
  assert baselines == [(b, e) for e in ("gold", "system") for b in table5.BASELINES]
  with_explanation = sum(1 for c in claims if c.explanation.strip())
  for r in rows:
    assert 0 <= r["rougeL"] <= 1 and 0 <= r["bleu"] <= 1
    assert "bertscore" not in r  # No text retriever in this workdir: left out, not faked.
    if r["label"] == "-":
      continue
    assert 0 <= r["classifier_agreement"] <= 1 and 0 <= r["classifier_agreement_gold"] <= 1
    texts = list(csv.DictReader(open(
        workdir / stage.EXPLANATIONS_DIR / f"{stage.GENERATORS[r['system']][0]}-"
        f"{r['evidence']}_evidence-{r['label']}_labels.csv")))
    assert r["distinct_texts"] == len({t["explanation"] for t in texts}) >= 1
    if r["label"] == "system":  # The first claim has no system label: skipped, counted.
      assert r["inputs/missing_label"] == 1 and r["inputs/claims"] == len(claims) - 1
      missing = 0 if claims[0].explanation.strip() else 1
      assert r["num_missing_prediction"] == 1 - missing
    else:
      assert r["inputs/claims"] == len(claims) and r["num_missing_prediction"] == 0
    assert r["num_scored"] == with_explanation
    if r["evidence"] == "system":  # The first claim retrieved nothing.
      assert r["inputs/no_evidence"] == (0 if r["label"] == "system" else 1)
  assert 0 <= out["classifier"]["macro_f1"] <= 1
  assert out["classifier"]["claims"] == with_explanation
  assert set(out["timings_s"]) == {"classifier", "explain_nll", "explain_reinforce"}
  assert set(out["peak_resident_gb"]) == set(out["timings_s"])
  assert all(gb > 0.1 for gb in out["peak_resident_gb"].values())  # JAX alone holds more.

  on_disk = json.load(open(workdir / table5.TABLE_JSON))
  assert [r["system"] for r in on_disk] == [r["system"] for r in rows]
  markdown = open(workdir / table5.TABLE_MD).read()
  assert "| BART + REINFORCE | system | system |" in markdown
  assert "Classifier agreement on generated explanations" in markdown
  assert "distinct texts)" in markdown
  assert "Truthfulness classifier on the test split" in markdown
  assert "Table 5 (test split" in text and "Table 5 without BERTScore" in text
  # The generated texts are kept, one file per generator and setting.
  files = os.listdir(workdir / stage.EXPLANATIONS_DIR)
  assert len(files) == 8 and "explain_reinforce-system_evidence-gold_labels.csv" in files


def test_only_the_reinforce_generator_trains_with_the_reward(stage_run):
  workdir, text = stage_run[0], stage_run[3]
  nll = [r for r in read_metrics(workdir / "stages" / "explain_nll") if "loss" in r]
  rl = [r for r in read_metrics(workdir / "stages" / "explain_reinforce") if "loss" in r]
  assert len(nll) == len(rl) == 6
  assert all("sc_weight" not in r for r in nll)
  # The rewarded generator started from the NLL one's checkpoint where the term starts.
  assert "starts from" in text and rl[:3] == nll[:3]
  assert [r["sc_weight"] for r in rl[3:]] == [0.5] * 3
  assert all(r["sample_tokens"] > 0 for r in rl[3:])


def test_starting_from_the_nll_checkpoint_is_training_from_scratch(stage_run, tmp_path):
  """The rewarded generator trained from step 0 has the NLL generator's curve until the
  term starts, then the curve of the stage's run that resumed from the NLL checkpoint."""
  workdir, inputs = stage_run[0], stage_run[4]
  classifier_dir = str(workdir / "stages" / stage.CLASSIFIER_DIR)
  config = _small_generator("tiny", str(workdir), 0, classifier_dir, **inputs)
  loop.train(config, str(tmp_path), log=lambda _: None)
  scratch = [r for r in read_metrics(tmp_path) if "loss" in r]
  resumed = [r for r in read_metrics(workdir / "stages" / "explain_reinforce") if "loss" in r]
  assert [r["sc_weight"] for r in scratch] == [0.0] * 3 + [0.5] * 3
  for a, b in zip(scratch, resumed):
    for key in ("loss", "nll", "grad_norm"):
      np.testing.assert_allclose(a[key], b[key], rtol=1e-5, err_msg=f"step {a['step']} {key}")
  for a, b in zip(scratch[3:], resumed[3:]):
    np.testing.assert_allclose(a["reward"], b["reward"], rtol=1e-5, atol=1e-6)
  # Configs differing in more than the classifier (or a run already started): no copy.
  other = _small_generator("tiny", str(workdir), 1, classifier_dir, **inputs)
  nll_config = _small_generator("tiny", str(workdir), 0, "", **inputs)
  nll_dir = str(workdir / "stages" / "explain_nll")
  assert not stage.start_from_nll_run(nll_dir, nll_config, str(tmp_path / "a"), other,
                                      log=lambda _: None)
  assert not stage.start_from_nll_run(nll_dir, nll_config, str(tmp_path), config,
                                      log=lambda _: None)


def test_small_generators_share_a_checkpoint_where_the_reward_starts(tmp_path):
  """On the small world the rewarded generator must find the NLL one's checkpoint at the
  reward's start step (else it would train every step again), and the two configs may
  differ in the classifier only (start_from_nll_run's condition)."""
  rewarded = stage.generator_config("small", str(tmp_path), 0, "classifier")
  plain = stage.generator_config("small", str(tmp_path), 0, "")
  start = rewarded.explain.sc_start_step
  assert 0 < start < rewarded.total_steps and start % rewarded.checkpoint_every == 0
  assert rewarded.explain.sc_weight > 0
  rewarded.explain.classifier = ""
  assert rewarded.to_dict() == plain.to_dict()


def test_agreement():
  probabilities = np.array([[0.8, 0.1, 0.1], [0.2, 0.7, 0.1], [0.1, 0.1, 0.8]])
  assert stage.agreement(probabilities, [0, 1, 0]) == pytest.approx(2 / 3)
  assert stage.agreement(probabilities[:0], []) is None


def test_bertscore_embedder_drops_special_tokens_and_caches():
  from flax import nnx
  from mocheg_jax.data.tokenizers import load_tokenizer, minilm_dir
  from mocheg_jax.models import bert
  tokenizer = load_tokenizer(str(minilm_dir()))  # Any WordPiece tokenizer will do.
  model = bert.BertModel(bert.BertConfig(vocab_size=len(tokenizer), hidden_size=16,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=32, max_position_embeddings=16),
                         rngs=nnx.Rngs(0))
  embed = stage.bert_token_embedder(model, tokenizer, max_length=8)
  texts = ["the bridge has three arches", "no", "the bridge has three arches " * 4]
  out = embed(texts)
  rows = [tokenizer(t, truncation=True, max_length=8)["input_ids"] for t in texts]
  ids, mask = np.zeros((3, 8), np.int32), np.zeros((3, 8), np.int32)
  for i, row in enumerate(rows):  # [CLS] ... [SEP], one padded batch: one compile.
    ids[i, :len(row)], mask[i, :len(row)] = row, 1
  hidden = np.asarray(jax.jit(lambda i, m: model(i, m, deterministic=True)[0])(ids, mask))
  for row, states, want in zip(rows, out, hidden):
    assert states.shape == (len(row) - 2, 16)
    np.testing.assert_allclose(states, want[1:len(row) - 1], atol=1e-5)
  assert embed(texts[:1])[0] is out[0]  # Encoded once.
