"""Verification inputs: gold and system evidence, the frozen-CLIP token-state store, batches.

One tiny synthetic world and one tiny random CLIP (a WordPiece tokenizer trained on the
world, [SEP] pooled) for the whole module.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import pickle
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mocheg_jax.data import text as text_lib
from mocheg_jax.data import tokenizers
from mocheg_jax.data.mocheg import MochegRelease
from mocheg_jax.data.report import MochegInputError
from mocheg_jax.data.synthetic import write_world
from mocheg_jax.models import clip
from mocheg_jax.models import encoding
from mocheg_jax.retrieval import results as results_lib
from mocheg_jax.verification import data as data_lib
from mocheg_jax.verification import evidence as evidence_lib
from mocheg_jax.verification import features
from mocheg_jax.verification import stance

FINGERPRINT = {"model": "tiny-random-clip", "seed": 0}
MAX_TEXT_LEN = 24  # Some synthetic sentences are longer: truncation is exercised.


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  root = tmp_path_factory.mktemp("world")
  write_world(root, "tiny", seed=0, workers=0, progress=False)
  return MochegRelease(root)


@pytest.fixture(scope="module")
def tokenizer(world, tmp_path_factory):
  texts = [t for split in ("train", "val") for c in world.claims(split)
           for t in (c.claim, *c.evidence)]
  return tokenizers.train_wordpiece(texts, tmp_path_factory.mktemp("tok"), vocab_size=300)


@pytest.fixture(scope="module")
def model(tokenizer):
  config = clip.CLIPConfig(
      text=clip.CLIPTextConfig(vocab_size=len(tokenizer), hidden_size=16,
                               intermediate_size=32, num_attention_heads=2,
                               num_hidden_layers=1, max_position_embeddings=32,
                               bos_token_id=tokenizer.cls_token_id,
                               eos_token_id=tokenizer.sep_token_id),
      vision=clip.CLIPVisionConfig(hidden_size=24, intermediate_size=32, num_attention_heads=2,
                                   num_hidden_layers=1, image_size=32, patch_size=16),
      projection_dim=8)
  graphdef, params, rest = nnx.split(
      nnx.eval_shape(lambda: clip.CLIPModel(config, rngs=nnx.Rngs(0))), nnx.Param, ...)
  rng = np.random.default_rng(0)
  nnx.replace_by_pure_dict(params, jax.tree.map(
      lambda s: rng.normal(0.0, 0.5, s.shape).astype(s.dtype), nnx.to_pure_dict(params)))
  return nnx.merge(graphdef, params, rest)


@pytest.fixture(scope="module")
def gold(world):
  return evidence_lib.gold_evidence(world, "train"), evidence_lib.gold_evidence(world, "val")


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory, model, tokenizer, gold):
  path = str(tmp_path_factory.mktemp("store") / "features")
  texts, images = evidence_lib.store_inputs(*gold)
  features.build_store(path, model, tokenizer, texts, images, fingerprint=FINGERPRINT,
                       max_text_len=MAX_TEXT_LEN, batch_size=16)
  return path


def _kb(world):
  sentences = list(world.iter_sentences())
  return sentences, world.kb_images()


def _write_system_csv(path, world, claims, sentences, kb_images):
  rows = []
  for n, c in enumerate(claims):
    picked = [sentences[(7 * n + j) % len(sentences)] for j in range(3)]
    names = [kb_images[(5 * n + j) % len(kb_images)] for j in range(2)]
    rows.append(results_lib.RetrievedEvidence(
        c.claim_id, tuple(s.corpus_id for s in picked), tuple(s.text for s in picked),
        (3.0, 2.0, 1.0), tuple(names), (0.9, 0.8)))
  results_lib.write_results(path, rows)
  return rows


# ---- evidence ------------------------------------------------------------------------------
def test_gold_evidence_keeps_every_claim_with_its_sentences_and_proofs(world, gold):
  train, _ = gold
  claims = world.claims("train")
  assert [e.claim_id for e in train] == [c.claim_id for c in claims]
  for e, c in zip(train, claims):
    assert e.claim == c.claim and e.label == c.label
    assert all(e.texts) and " ".join(e.texts).split() == " ".join(c.evidence).split()
    assert e.texts == tuple(s for snippet in c.evidence
                            for s in text_lib.split_sentences(snippet))
    assert e.images == tuple(os.path.abspath(world.image_path(n)) for n in c.proof_images)
    assert all(os.path.isabs(p) and os.path.isfile(p) for p in e.images)
    assert e.relevant_texts == e.texts  # Gold evidence: every item is relevant.
    assert e.relevant_images == e.images
  # The tiny world's snippets are single sentences; a paragraph of several is split.
  assert evidence_lib.evidence_sentences(
      ["It opened in 1901. Dr. Venn built it! ", "", "  ", "Was it red? No."]) == (
          "It opened in 1901.", "Dr. Venn built it!", "Was it red?", "No.")
  assert any(not e.texts for e in train), "a claim without text evidence is still a claim"
  assert any(not e.images for e in train)


def test_system_evidence_takes_the_top_k_of_the_result_csv(world, tmp_path):
  claims = world.claims("val")
  sentences, kb_images = _kb(world)
  path = tmp_path / "results.csv"
  # Another split's claim in the CSV is ignored.
  rows = _write_system_csv(path, world, claims + world.claims("test")[:1], sentences,
                           kb_images)
  got = evidence_lib.system_evidence(world, "val", path, top_text=2, top_images=1)
  assert [e.claim_id for e in got] == [c.claim_id for c in claims]
  for e, c, row in zip(got, claims, rows):
    assert e.label == c.label and e.claim == c.claim
    assert e.texts == row.texts[:2]
    assert e.images == (os.path.abspath(world.image_path(row.images[0])),)
    judged = {d for d, rel in world.text_qrels("val").get(c.claim_id, {}).items() if rel > 0}
    also = tuple(t for i, t in zip(row.text_ids, row.texts) if i in judged)
    assert e.relevant_texts == tuple(dict.fromkeys(
        evidence_lib.evidence_sentences(c.evidence) + also))
  none = evidence_lib.system_evidence(world, "val", path, top_text=0, top_images=0)
  assert all(not e.texts and not e.images for e in none) and len(none) == len(claims)
  image_only = evidence_lib.restrict(got, text=False)
  assert all(not e.texts and e.images for e in image_only)


def _rewrite(path, change):
  with open(path, newline="", encoding="utf-8") as f:
    table = list(csv.reader(f))
  with open(path, "w", newline="", encoding="utf-8") as f:
    csv.writer(f, lineterminator="\n").writerows(change(table))


def test_system_evidence_counts_what_the_qrels_judge_relevant(world, tmp_path):
  # A release may cut its KB sentences differently from its evidence paragraphs: a
  # retrieved sentence is relevant when the qrels say so, whatever its text.
  claim = next(c for c in world.claims("val")
               if any(rel > 0 for rel in world.text_qrels("val").get(c.claim_id, {}).values()))
  relevant_id = next(d for d, rel in world.text_qrels("val")[claim.claim_id].items() if rel > 0)
  sentences, kb_images = _kb(world)
  path = tmp_path / "results.csv"
  rows = _write_system_csv(path, world, world.claims("val"), sentences, kb_images)
  rows = [dataclasses.replace(r, text_ids=(relevant_id, *r.text_ids[1:]),
                              texts=("Cut another way.", *r.texts[1:]))
          if r.claim_id == claim.claim_id else r for r in rows]
  results_lib.write_results(path, rows)
  got = {e.claim_id: e for e in evidence_lib.system_evidence(world, "val", path)}
  assert "Cut another way." in got[claim.claim_id].relevant_texts
  gold = evidence_lib.evidence_sentences(claim.evidence)
  assert got[claim.claim_id].relevant_texts[:len(gold)] == gold  # The gold ones first.


def test_system_evidence_marks_the_images_the_image_qrels_judge_relevant(world, tmp_path):
  qrels = world.image_qrels("val")
  claim = next(c for c in world.claims("val")
               if any(rel > 0 for rel in qrels.get(c.claim_id, {}).values()))
  relevant = next(n for n, rel in qrels[claim.claim_id].items() if rel > 0)
  sentences, kb_images = _kb(world)
  unjudged = next(n for n in kb_images if n not in qrels[claim.claim_id])
  path = tmp_path / "results.csv"
  rows = _write_system_csv(path, world, world.claims("val"), sentences, kb_images)
  rows = [dataclasses.replace(r, images=(unjudged, relevant))
          if r.claim_id == claim.claim_id else r for r in rows]
  results_lib.write_results(path, rows)
  got = {e.claim_id: e for e in evidence_lib.system_evidence(world, "val", path)}
  mine = got[claim.claim_id]
  assert mine.images == tuple(os.path.abspath(world.image_path(n))
                              for n in (unjudged, relevant))
  assert mine.relevant_images == mine.images[1:]
  assert not any(set(e.relevant_images) - set(e.images) for e in got.values())


def test_system_evidence_bad_input(world, tmp_path):
  claims = world.claims("val")
  sentences, kb_images = _kb(world)
  path = tmp_path / "results.csv"
  rows = _write_system_csv(path, world, claims, sentences, kb_images)

  # Claims of the split missing from the CSV.
  _write_system_csv(path, world, claims[2:], sentences, kb_images)
  with pytest.raises(MochegInputError, match=rf"2 of the {len(claims)} val claims have no "
                     rf"row \(e.g. claim {claims[0].claim_id}\)"):
    evidence_lib.system_evidence(world, "val", path)

  # A sentence id the KB does not hold.
  bad = [results_lib.RetrievedEvidence(
      r.claim_id, ("999999-1-0", *r.text_ids[1:]), r.texts, r.text_scores, r.images,
      r.image_scores) if i == 1 else r for i, r in enumerate(rows)]
  results_lib.write_results(path, bad)
  with pytest.raises(MochegInputError, match=r"1 retrieved sentence id\(s\) are not in the "
                     rf"knowledge base.*\(e.g. '999999-1-0' for claim {claims[1].claim_id}\)"):
    evidence_lib.system_evidence(world, "val", path)
  # Beyond top_text it is not used, so not checked.
  assert len(evidence_lib.system_evidence(world, "val", path, top_text=0)) == len(claims)

  # A KB image name whose file does not exist; a proof image where a KB image belongs.
  for name, message in (("00001-00002-77-gone.jpg", "does not exist"),
                        ("00001-proof-01-x.jpg", "a proof image, not a KB image"),
                        ("not-an-image-name.jpg", "not a KB image name")):
    bad = [results_lib.RetrievedEvidence(r.claim_id, r.text_ids, r.texts, r.text_scores,
                                         (name,), (0.5,)) if i == 3 else r
           for i, r in enumerate(rows)]
    results_lib.write_results(path, bad)
    with pytest.raises(MochegInputError, match=rf"claim {claims[3].claim_id}.*{message}"):
      evidence_lib.system_evidence(world, "val", path)

  # A CSV without a needed column.
  results_lib.write_results(path, rows)
  _rewrite(path, lambda table: [r[:-1] for r in table])
  with pytest.raises(MochegInputError, match="lacks column.*image_scores"):
    evidence_lib.system_evidence(world, "val", path)


def test_gold_evidence_with_a_missing_proof_image_is_an_error(world, tmp_path):
  root = tmp_path / "copy"
  shutil.copytree(world.root, root)
  copy = MochegRelease(root)
  claim = next(c for c in copy.claims("val") if c.proof_images)
  os.remove(copy.image_path(claim.proof_images[0]))
  with pytest.raises(MochegInputError, match=rf"val claim {claim.claim_id} proof image "
                     rf".*{claim.proof_images[0]}.*does not exist"):
    evidence_lib.gold_evidence(copy, "val")


# ---- the store -----------------------------------------------------------------------------
def test_store_holds_the_direct_clip_forward(store_dir, model, tokenizer, gold):
  store = features.open_store(store_dir, expect_fingerprint=FINGERPRINT)
  texts, images = evidence_lib.store_inputs(*gold)
  assert store.num_texts == len(texts) and store.num_images == len(images)
  assert store.manifest.dtype == "float16" and store.manifest.max_text_len == MAX_TEXT_LEN
  lengths = [len(x) for x in encoding.tokenize(tokenizer, texts, MAX_TEXT_LEN)]
  np.testing.assert_array_equal(store.text_lengths(texts), lengths)
  assert max(lengths) == MAX_TEXT_LEN and min(lengths) < MAX_TEXT_LEN  # Some were cut.

  picks = [texts[0], max(texts, key=len), min(texts, key=len), gold[0][5].texts[0]]
  states, mask = store.text(picks)
  assert states.dtype == np.float16 and mask.shape == states.shape[:2]
  for row, t in enumerate(picks):
    ids = np.asarray(encoding.tokenize(tokenizer, [t], MAX_TEXT_LEN)[0], np.int32)[None]
    want = np.asarray(model.text_features(jnp.asarray(ids)).hidden[0])  # No padding at all.
    n = ids.shape[1]
    assert mask[row].sum() == n and mask[row, :n].all()
    np.testing.assert_allclose(states[row, :n].astype(np.float32), want, rtol=1e-2, atol=1e-2)
    assert not states[row, n:].any()
  ids = store.token_ids(picks, MAX_TEXT_LEN)
  for row, t in enumerate(picks):
    want = encoding.tokenize(tokenizer, [t], MAX_TEXT_LEN)[0]
    np.testing.assert_array_equal(ids[row, :len(want)], want)
    assert (ids[row, len(want):] == -1).all()
  short, short_mask = store.text(picks, length=5)
  assert short.shape[1] == 5 and short_mask.all()
  np.testing.assert_array_equal(short, states[:, :5])

  size = model.config.vision.image_size
  paths = images[:3]
  got = store.image(paths)
  assert got.shape == (3, 4, 24)
  pixels = np.stack([encoding.read_image(p, size) for p in paths])
  want = np.asarray(model.image_features(jnp.asarray(pixels)).patches)
  np.testing.assert_allclose(got.astype(np.float32), want, rtol=1e-2, atol=1e-2)
  assert np.abs(want).max() > 0.1  # Not all near zero: the comparison means something.

  copy = pickle.loads(pickle.dumps(store))  # For grain workers: maps reopened lazily.
  np.testing.assert_array_equal(copy.text(picks)[0], states)
  np.testing.assert_array_equal(copy.image(paths), got)

  with pytest.raises(MochegInputError, match="text not in the feature store"):
    store.text(["a text nobody encoded"])
  with pytest.raises(MochegInputError, match="image not in the feature store"):
    store.image(["/nowhere/x.jpg"])


def _counting(monkeypatch):
  calls = {"texts": [], "images": []}
  text_fn, image_fn = features.encode_text_states, features.encode_image_states

  def texts(model, tokenizer, t, **kw):
    calls["texts"].append(list(t))
    return text_fn(model, tokenizer, t, **kw)

  def images(model, p, **kw):
    calls["images"].append(list(p))
    return image_fn(model, p, **kw)

  monkeypatch.setattr(features, "encode_text_states", texts)
  monkeypatch.setattr(features, "encode_image_states", images)
  return calls


def test_a_second_build_encodes_only_new_keys(tmp_path, world, model, tokenizer, gold,
                                              store_dir, monkeypatch):
  path = str(tmp_path / "features")
  shutil.copytree(store_dir, path)  # The gold store; then add system evidence.
  sentences, kb_images = _kb(world)
  csv_path = tmp_path / "results.csv"
  _write_system_csv(csv_path, world, world.claims("val"), sentences, kb_images)
  system = evidence_lib.system_evidence(world, "val", csv_path, top_text=3, top_images=2)
  old_texts, old_images = evidence_lib.store_inputs(*gold)
  texts, images = evidence_lib.store_inputs(gold[1], system)
  new_texts = [t for t in texts if t not in set(old_texts)]
  new_images = [p for p in images if p not in set(old_images)]
  assert new_texts and new_images and len(new_texts) < len(texts)

  calls = _counting(monkeypatch)
  manifest = features.build_store(path, model, tokenizer, texts + texts[:3], images,
                                  fingerprint=FINGERPRINT, max_text_len=MAX_TEXT_LEN,
                                  batch_size=16, devices=jax.devices()[:1])
  assert calls == {"texts": [new_texts], "images": [new_images]}
  assert [p["name"] for p in manifest.parts] == ["part-00000", "part-00001"]
  store = features.open_store(path)
  assert store.num_texts == len(old_texts) + len(new_texts)
  # The new part (one device) agrees with a fresh store of the same keys (8 devices).
  fresh = str(tmp_path / "fresh")
  features.build_store(fresh, model, tokenizer, new_texts[:4], new_images[:2],
                       fingerprint=FINGERPRINT, max_text_len=MAX_TEXT_LEN, batch_size=16)
  other = features.open_store(fresh)
  # Not bit-equal: the two builds run different batch shapes, which XLA may sum in another
  # order (one float16 ulp seen with its CPU optimisations off).
  np.testing.assert_allclose(store.text(new_texts[:4])[0].astype(np.float32),
                             other.text(new_texts[:4])[0].astype(np.float32),
                             rtol=2e-3, atol=1e-4)
  np.testing.assert_allclose(store.image(new_images[:2]).astype(np.float32),
                             other.image(new_images[:2]).astype(np.float32), atol=2e-3)

  calls["texts"].clear(), calls["images"].clear()
  again = features.build_store(path, model, tokenizer, texts, images, fingerprint=FINGERPRINT,
                               max_text_len=MAX_TEXT_LEN)
  assert calls == {"texts": [], "images": []} and again == manifest


def test_another_fingerprint_or_layout_is_refused(store_dir, model, tokenizer, gold):
  texts, images = evidence_lib.store_inputs(*gold)
  before = sorted(os.listdir(store_dir))
  with pytest.raises(MochegInputError, match="built differently.*fingerprint"):
    features.build_store(store_dir, model, tokenizer, texts + ["new"], images,
                         fingerprint={"model": "another"}, max_text_len=MAX_TEXT_LEN)
  with pytest.raises(MochegInputError, match="max_text_len: store has 24, asked for 32"):
    features.build_store(store_dir, model, tokenizer, texts, images, fingerprint=FINGERPRINT,
                         max_text_len=32)
  with pytest.raises(MochegInputError, match="another model"):
    features.open_store(store_dir, expect_fingerprint={"model": "another"})
  assert sorted(os.listdir(store_dir)) == before


def test_a_store_moved_with_its_folder_is_read_there(tmp_path, world, model, tokenizer):
  """A pipeline folder copied elsewhere: its store's fingerprint and image keys name the
  old folder, and are read (and extended) as naming the new one."""
  old, new = tmp_path / "cluster" / "run", tmp_path / "home" / "run"
  shutil.copytree(world.root, old / "release")
  claims = evidence_lib.gold_evidence(MochegRelease(old / "release"), "val")[:4]
  texts, images = evidence_lib.store_inputs(claims)
  assert images
  clip_at = {"clip": str(old / "stages" / "retrieval_image"), "step": 3}
  features.build_store(old / "features", model, tokenizer, texts, images,
                       fingerprint=clip_at, max_text_len=MAX_TEXT_LEN)
  states = features.open_store(old / "features").image(images)
  shutil.copytree(old, new)
  shutil.rmtree(old)
  moved = (str(old), str(new))
  now = {**clip_at, "clip": str(new / "stages" / "retrieval_image")}
  new_images = [p.replace(str(old), str(new)) for p in images]
  store = features.open_store(new / "features", expect_fingerprint=now, moved=moved)
  assert all(store.has_image(p) for p in new_images)
  np.testing.assert_array_equal(store.image(new_images), states)
  before = sorted(os.listdir(new / "features"))
  features.build_store(new / "features", model, tokenizer, texts, new_images,
                       fingerprint=now, max_text_len=MAX_TEXT_LEN, moved=moved)
  assert sorted(os.listdir(new / "features")) == before  # Nothing was missing.
  with pytest.raises(MochegInputError, match="another model"):  # Not told it moved.
    features.open_store(new / "features", expect_fingerprint=now)
  with pytest.raises(MochegInputError, match="another model"):
    features.open_store(new / "features", expect_fingerprint={**now, "step": 4}, moved=moved)


def test_a_crash_mid_build_leaves_no_finished_store(tmp_path, model, tokenizer, gold,
                                                    monkeypatch):
  texts, images = evidence_lib.store_inputs(gold[1])

  def crash(*args, **kwargs):
    raise RuntimeError("device lost")

  path = str(tmp_path / "features")
  calls = _counting(monkeypatch)
  monkeypatch.setattr(features, "encode_image_states", crash)  # After the texts are written.
  with pytest.raises(RuntimeError, match="device lost"):
    features.build_store(path, model, tokenizer, texts, images, fingerprint=FINGERPRINT,
                         max_text_len=MAX_TEXT_LEN)
  assert calls["texts"] == [texts]  # The text states were encoded and written...
  with pytest.raises(MochegInputError, match="not a finished feature store"):
    features.open_store(path)  # ...but no store is finished.

  # A finished store, then a crash while extending it: the finished part stays usable.
  monkeypatch.undo()
  features.build_store(path, model, tokenizer, texts, images[:1], fingerprint=FINGERPRINT,
                       max_text_len=MAX_TEXT_LEN)
  assert sorted(os.listdir(path)) == ["manifest.json", "part-00000"]  # Leftovers cleaned.
  monkeypatch.setattr(features, "encode_image_states", crash)
  with pytest.raises(RuntimeError):
    features.build_store(path, model, tokenizer, texts, images, fingerprint=FINGERPRINT,
                         max_text_len=MAX_TEXT_LEN)
  store = features.open_store(path)
  assert store.num_images == 1 and not store.has_image(images[1])
  monkeypatch.undo()
  features.build_store(path, model, tokenizer, texts, images, fingerprint=FINGERPRINT,
                       max_text_len=MAX_TEXT_LEN)
  assert features.open_store(path).num_images == len(images)

  # A missing image is found before anything is encoded.
  with pytest.raises(MochegInputError, match="gone.jpg.*does not exist"):
    features.build_store(path, model, tokenizer, ["brand new"], [str(tmp_path / "gone.jpg")],
                         fingerprint=FINGERPRINT, max_text_len=MAX_TEXT_LEN)
  assert not features.open_store(path).has_text("brand new")


# ---- batches -------------------------------------------------------------------------------
def test_examples_have_fixed_shapes_masks_and_cut_counts(store_dir, gold):
  store = features.open_store(store_dir)
  train, _ = gold
  batches = data_lib.VerificationBatches(train, store, max_claim_len=20, max_text_len=16,
                                         max_text_items=2, max_images=1)
  assert len(batches) == len(train)
  expected_text_cut = sum(max(0, len(e.texts) - 2) for e in train)
  expected_image_cut = sum(max(0, len(e.images) - 1) for e in train)
  assert expected_text_cut > 0 and expected_image_cut > 0
  assert batches.cut.text_items == expected_text_cut
  assert batches.cut.images == expected_image_cut
  assert batches.cut.claims_truncated == int((store.text_lengths(
      [e.claim for e in train]) > 20).sum()) > 0
  for i in (0, next(i for i, e in enumerate(train) if not e.texts),
            next(i for i, e in enumerate(train) if len(e.images) > 1)):
    e, x = train[i], batches[i]
    assert x["claim"].shape == (20, 16) and x["claim_mask"].shape == (20,)
    assert x["text"].shape == (2, 16, 16) and x["text_mask"].shape == (2, 16)
    assert x["image"].shape == (1, 4, 24) and x["image_mask"].shape == (1,)
    assert x["label"] == e.label and x["claim_id"] == e.claim_id and x["valid"]
    assert x["claim_mask"].sum() == min(20, store.text_lengths([e.claim])[0])
    kept = e.texts[:2]
    lengths = np.minimum(store.text_lengths(kept), 16) if kept else []
    np.testing.assert_array_equal(x["text_mask"].sum(1),
                                  np.pad(lengths, (0, 2 - len(kept))).astype(int))
    for j, t in enumerate(kept):
      np.testing.assert_array_equal(x["text"][j], store.text([t], 16)[0][0])
    assert not x["text"][len(kept):].any()
    np.testing.assert_array_equal(x["image_mask"], [bool(e.images)])
    if e.images:
      np.testing.assert_array_equal(x["image"][0], store.image(e.images[:1])[0])
  bad = [evidence_lib.ClaimEvidence(1, train[0].claim, 3, (), ())]
  with pytest.raises(MochegInputError, match="label 3 is not in 0..2"):
    data_lib.VerificationBatches(bad, store)
  missing = [evidence_lib.ClaimEvidence(1, train[0].claim, 0, ("never encoded",), ())]
  with pytest.raises(MochegInputError, match="1 texts of the evidence are not in the feature"):
    data_lib.VerificationBatches(missing, store)
  # A claim twice with other evidence is two examples (verify.train_also_gold); twice with
  # the same is an error.
  with_text = next(e for e in train if len(e.texts) > 1)
  other = dataclasses.replace(with_text, texts=with_text.texts[:1], images=())
  assert len(data_lib.VerificationBatches([with_text, other], store)) == 2
  with pytest.raises(MochegInputError, match=rf"claim {with_text.claim_id} occurs twice with "
                     "the same evidence"):
    data_lib.VerificationBatches([with_text, other, with_text], store)


def test_a_store_of_an_older_format_or_without_token_ids_is_refused(store_dir, tmp_path):
  old = tmp_path / "old"
  shutil.copytree(store_dir, old)
  manifest = json.loads((old / "manifest.json").read_text())
  (old / "manifest.json").write_text(json.dumps(dict(manifest, version=1)))
  with pytest.raises(MochegInputError, match="format version 1, this code reads 3; rebuild"):
    features.open_store(old)
  lost = tmp_path / "lost"
  shutil.copytree(store_dir, lost)
  (lost / "part-00000" / "text_ids.npy").unlink()
  with pytest.raises(MochegInputError, match=r"text_ids\.npy: cannot read"):
    features.open_store(lost)


def test_embeddings_are_clips_unit_vectors_and_give_the_image_score(tmp_path, store_dir, model,
                                                                  tokenizer, gold):
  texts, images = evidence_lib.store_inputs(*gold)
  path = str(tmp_path / "embedded")
  features.build_store(path, model, tokenizer, texts, images, fingerprint=FINGERPRINT,
                       max_text_len=MAX_TEXT_LEN, batch_size=16, embeddings=True)
  store = features.open_store(path)
  assert store.manifest.embed_dim == model.config.projection_dim

  def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)

  picks = [texts[0], max(texts, key=len)]
  want = unit(encoding.encode_clip_texts(model, tokenizer, picks, max_length=MAX_TEXT_LEN))
  np.testing.assert_allclose(store.text_embedding(picks).astype(np.float32), want, atol=2e-3)
  want = unit(encoding.encode_clip_images(model, images[:3]))
  got = store.image_embedding(images[:3]).astype(np.float32)
  np.testing.assert_allclose(got, want, atol=2e-3)

  train, _ = gold
  batches = data_lib.VerificationBatches(train, store, max_images=2, image_score=True)
  with_images = next(i for i, e in enumerate(train) if len(e.images) == 1)
  example, e = batches[with_images], train[with_images]
  claim = store.text_embedding([e.claim]).astype(np.float32)[0]
  image = store.image_embedding(e.images).astype(np.float32)[0]
  np.testing.assert_allclose(example["image_score"], [image @ claim, 0.0], rtol=1e-6)
  assert abs(example["image_score"][0]) > 1e-3  # Not zero by accident.
  assert "image_embed" not in example
  embedded = data_lib.VerificationBatches(train, store, max_images=2, image_embeds=True)
  example = embedded[with_images]
  assert "image_score" not in example
  np.testing.assert_allclose(example["claim_embed"], claim)
  np.testing.assert_allclose(example["image_embed"], [image, np.zeros_like(image)])
  assert example["image_embed"].dtype == example["claim_embed"].dtype == np.float32

  plain = features.open_store(store_dir)  # Built without embeddings.
  for name in ("image_score", "image_embeds"):
    with pytest.raises(MochegInputError, match=f"{name} needs a feature store with CLIP"):
      data_lib.VerificationBatches(train, plain, **{name: True})
  with pytest.raises(MochegInputError, match="holds no CLIP embeddings"):
    plain.text_embedding(picks)
  with pytest.raises(MochegInputError, match="embed_dim"):  # One store: all parts or none.
    features.build_store(store_dir, model, tokenizer, ["a new text"], [],
                         fingerprint=FINGERPRINT, max_text_len=MAX_TEXT_LEN, embeddings=True)


def test_token_match_marks_the_claim_tokens_each_item_repeats(store_dir, tokenizer, gold):
  store = features.open_store(store_dir)
  train, _ = gold
  plain = data_lib.VerificationBatches(train, store, max_claim_len=20, max_text_len=16,
                                       max_text_items=2, max_images=1)
  batches = data_lib.VerificationBatches(train, store, max_claim_len=20, max_text_len=16,
                                         max_text_items=2, max_images=1, token_match=True)
  assert "text_match" not in plain[0]
  seen = set()
  for i, e in enumerate(train):
    x = batches[i]
    match = x["text_match"]
    assert match.shape == (2, 20) and match.dtype == np.float32
    claim = encoding.tokenize(tokenizer, [e.claim], MAX_TEXT_LEN)[0][:20]
    for j in range(2):
      if j >= len(e.texts):  # An absent item matches nothing.
        assert not match[j].any()
        continue
      item = set(encoding.tokenize(tokenizer, [e.texts[j]], MAX_TEXT_LEN)[0][:16])
      want = np.zeros(20)
      want[:len(claim)] = [t in item for t in claim]
      np.testing.assert_array_equal(match[j], want)
      seen.add(tuple(np.unique(want[1:len(claim) - 1])))
    for k, v in plain[i].items():
      np.testing.assert_array_equal(x[k], v)
  assert (0.0, 1.0) in seen  # Items that repeat some claim words and not others.


def test_match_bits_tell_a_name_from_the_same_words_in_another_order():
  # Claim "[CLS] the pellarda river teems [SEP]" (ids 0-5), padded with -1.
  claim = np.array([0, 1, 2, 3, 4, 5, -1, -1])
  items = np.array([[0, 1, 3, 2, 6, 5, -1, -1],   # [CLS] the river pellarda supports [SEP]
                    [0, 7, 1, 2, 3, 8, 5, -1],    # [CLS] permits the pellarda river sell ...
                    [-1] * 8])                    # padding only
  unigram, phrase = data_lib.match_bits(claim, items)
  assert unigram.dtype == phrase.dtype == np.float32
  np.testing.assert_array_equal(unigram, [[1, 1, 1, 1, 0, 1, 0, 0],
                                          [1, 1, 1, 1, 0, 1, 0, 0],
                                          [0] * 8])
  # Only the look-alike's order breaks the name's pairs; [CLS] the is a pair of the first.
  np.testing.assert_array_equal(phrase, [[1, 1, 0, 0, 0, 0, 0, 0],
                                         [0, 1, 1, 1, 0, 0, 0, 0],
                                         [0] * 8])


def test_phrase_match_marks_the_claim_tokens_in_pairs_the_item_repeats(store_dir, tokenizer,
                                                                       gold):
  store = features.open_store(store_dir)
  train, _ = gold
  batches = data_lib.VerificationBatches(train, store, max_claim_len=20, max_text_len=16,
                                         max_text_items=2, max_images=1, phrase_match=True)
  assert "text_match" not in batches[0]  # Each kind of bits only when asked for.
  seen = set()
  for i, e in enumerate(train):
    phrase = batches[i]["text_phrase_match"]
    assert phrase.shape == (2, 20) and phrase.dtype == np.float32
    claim = list(encoding.tokenize(tokenizer, [e.claim], MAX_TEXT_LEN)[0][:20])
    for j in range(2):
      if j >= len(e.texts):
        assert not phrase[j].any()
        continue
      item = list(encoding.tokenize(tokenizer, [e.texts[j]], MAX_TEXT_LEN)[0][:16])
      item_pairs = set(zip(item, item[1:]))
      in_pair = [(a, b) in item_pairs for a, b in zip(claim, claim[1:])]
      want = np.zeros(20)
      for q in range(len(claim)):
        want[q] = (q > 0 and in_pair[q - 1]) or (q < len(in_pair) and in_pair[q])
      np.testing.assert_array_equal(phrase[j], want)
      seen.add(tuple(np.unique(want[1:len(claim) - 1])))
  assert (0.0, 1.0) in seen


def test_item_relevance_marks_the_items_among_the_claims_gold_evidence(store_dir, gold):
  store = features.open_store(store_dir)
  train, _ = gold
  # System-like evidence: a claim's items are its first gold sentence and another claim's.
  other = next(t for e in train for t in e.texts if t not in train[0].relevant_texts)
  mixed = [dataclasses.replace(train[0], texts=(other, train[0].relevant_texts[0]))]
  batches = data_lib.VerificationBatches(mixed, store, max_claim_len=20, max_text_len=16,
                                         max_text_items=3, max_images=1, item_relevance=True)
  x = batches[0]
  np.testing.assert_array_equal(x["text_relevant"], [0.0, 1.0, 0.0])  # Padding: 0.
  assert x["text_relevant"].dtype == x["image_relevant"].dtype == np.float32
  plain = data_lib.VerificationBatches(mixed, store, max_claim_len=20, max_text_len=16,
                                       max_text_items=3, max_images=1)[0]
  assert "text_relevant" not in plain and "image_relevant" not in plain
  # Images: the claim's proof image judged relevant, another claim's not.
  with_image = next(e for e in train if e.images)
  other_image = next(p for e in train for p in e.images if p not in with_image.images)
  shown = [dataclasses.replace(with_image, images=(other_image, with_image.images[0]))]
  x = data_lib.VerificationBatches(shown, store, max_claim_len=20, max_text_len=16,
                                   max_text_items=1, max_images=3, item_relevance=True)[0]
  np.testing.assert_array_equal(x["image_relevant"], [0.0, 1.0, 0.0])


def test_eval_batches_cover_every_claim_once_with_padding_rows(store_dir, gold):
  _, val = gold
  batches = data_lib.VerificationBatches(val, features.open_store(store_dir), max_claim_len=16,
                                         max_text_len=16, max_text_items=4, max_images=2)
  out = list(batches.eval_batches(4))
  assert len(out) == -(-len(val) // 4)
  ids = np.concatenate([b["claim_id"] for b in out])
  valid = np.concatenate([b["valid"] for b in out])
  assert valid.sum() == len(val) and not valid[len(val):].any()
  np.testing.assert_array_equal(ids[:len(val)], [e.claim_id for e in val])
  assert (ids[len(val):] == -1).all()
  last = out[-1]
  pad = ~last["valid"]
  assert pad.any() and not last["claim_mask"][pad].any() and not last["text_mask"][pad].any()
  assert not last["image_mask"][pad].any()
  assert {b["text"].shape for b in out} == {(4, 4, 16, 16)}

  # The stance model takes these batches as they are.
  config = stance.StanceConfig(text_dim=16, image_dim=24, hidden=8)
  model = stance.StanceDetector(config, rngs=nnx.Rngs(0))
  logits = model(**{k: jnp.asarray(v) for k, v in out[0].items()
                    if k not in ("label", "claim_id", "valid")})
  assert logits.shape == (4, 3) and bool(jnp.isfinite(logits).all())


def test_train_iterator_shuffles_repeats_and_restores(store_dir, gold):
  _, val = gold
  batches = data_lib.VerificationBatches(val, features.open_store(store_dir), max_claim_len=8,
                                         max_text_len=8, max_text_items=2, max_images=1)
  n = len(batches)
  assert n % 5 == 0
  ds = batches.train_dataset(5, seed=3, shard_index=0, shard_count=1)
  it = iter(ds)
  epochs = [np.concatenate([next(it)["claim_id"] for _ in range(n // 5)]) for _ in range(2)]
  for ids in epochs:
    assert sorted(ids) == sorted(e.claim_id for e in val)
  assert list(epochs[0]) != list(epochs[1])  # Reshuffled per epoch.
  state = it.get_state()
  following = next(it)
  restored = iter(ds)
  restored.set_state(state)
  again = next(restored)
  assert following.keys() == again.keys()
  for k in following:
    np.testing.assert_array_equal(following[k], again[k])
  first = next(iter(batches.train_dataset(5, seed=3, shard_index=0, shard_count=1)))
  np.testing.assert_array_equal(first["claim_id"], epochs[0][:5])  # Deterministic per seed.
  # Two processes' batches of 2, concatenated in process order, are one process's batches
  # of 4: the global batches do not depend on the number of processes.
  whole = iter(batches.train_dataset(4, seed=0, shard_index=0, shard_count=1))
  halves = [iter(batches.train_dataset(2, seed=0, shard_index=i, shard_count=2))
            for i in range(2)]
  for _ in range(n):
    joined = np.concatenate([next(h)["claim_id"] for h in halves])
    np.testing.assert_array_equal(joined, next(whole)["claim_id"])
