"""Our MiniLM (the real all-MiniLM-L6-v2 weights) against sentence-transformers, text by text."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest
from flax import nnx

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.data.tokenizers import minilm_dir
from mocheg_jax.models import sentence_transformers as st

os.environ.setdefault("HF_HUB_OFFLINE", "1")
MIN_COSINE = 0.99999

_WORDS = ("claim senator photo bridge budget river election vaccine video council report "
          "false misleading accurate governor statement tweet viral percent million").split()
_FIXED = (
    "", "   ", "Yes.", "No!", "OK?", "fact-check", "A", "...",
    "The budget rose 12.5% to $3,400,000 in 2021, up from 1,999 in 1999.",
    "Call 555-0199 or +1 (202) 555-0147 before 10:30 p.m. on 04/05/2023.",
    "Wait... what?! \"Quoted\" 'single' (paren) [brackets] {braces} <angle> -- dash; semi: colon",
    "Café au lait coûte 3 € à Zürich, naïve résumé façade.",
    "東京は日本の首都です。北京是中国的首都。",
    "Привет, мир! Γειά σου Κόσμε. مرحبا بالعالم",
    "Emoji test 🙂👍🔥 and symbols ™ © ® ° ± × ÷ ≤ ≥",
    "UPPER CASE SHOUTING ABOUT THE ELECTION RESULTS",
    "tabs\tand\nnewlines\r\nmixed   spaces",
    "https://www.example.com/path?query=1&x=2 #hashtag @mention user_name",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
)


def varied_sentences(n: int = 120, seed: int = 0) -> list[str]:
  """Deterministic varied texts: the fixed awkward cases above, then random ones of every
  length class: short, medium, beyond 256 tokens (truncated) and beyond 512 tokens."""
  rng = random.Random(seed)
  out = list(_FIXED)
  extras = ["", "!", "?", ",", " 42", " 3.14", " 1,000", " 2024", " café", " naïve", " 🙂",
            " U.S.", " e.g.", " don't", " it's"]
  kinds, weights = ("short", "medium", "long", "very long"), (0.35, 0.51, 0.08, 0.06)
  while len(out) < n:
    kind = rng.choices(kinds, weights)[0]
    words = {"short": (1, 6), "medium": (8, 40), "long": (110, 200),
             "very long": (600, 800)}[kind]
    text = " ".join(rng.choice(_WORDS) + rng.choice(extras)
                    for _ in range(rng.randint(*words)))
    out.append(text[0].upper() + text[1:] + rng.choice([".", "!", "?", ""]))
  return out


@pytest.fixture(scope="module")
def models():
  from sentence_transformers import SentenceTransformer
  folder = minilm_dir()
  return st.load(folder), SentenceTransformer(str(folder), device="cpu")


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_generator_is_deterministic_and_varied(models):
  texts = varied_sentences()
  assert texts == varied_sentences() and len(texts) >= 100
  tokenizer = models[0].tokenizer
  lengths = [len(tokenizer(t)["input_ids"]) for t in texts]
  assert "" in texts and min(lengths) == 2
  assert sum(n > 256 for n in lengths) >= 10 and max(lengths) > 512
  assert sum(n < 16 for n in lengths) >= 10


def test_structure_of_the_package_folder(models):
  ours, _ = models
  assert ours.max_seq_length == 256
  assert ours.encoder.pooling == "mean" and ours.encoder.normalize
  assert ours.encoder.config.hidden_size == 384 and ours.encoder.config.num_hidden_layers == 6


def test_embeddings_match_sentence_transformers(models):
  ours, reference = models
  texts = varied_sentences()
  mine = ours.encode(texts, batch_size=32)
  expected = reference.encode(texts, batch_size=32, convert_to_numpy=True)
  assert mine.shape == (len(texts), 384) and mine.dtype == np.float32
  cosine = _cosines(mine, expected)
  worst = int(cosine.argmin())
  assert cosine.min() >= MIN_COSINE, (worst, texts[worst][:80], cosine.min())
  np.testing.assert_allclose(np.linalg.norm(mine, axis=1), 1.0, atol=1e-5)


def test_left_truncation_keeps_the_end(models):
  ours, reference = models
  tail = "the final words decide the verdict"
  tail_tokens = len(ours.tokenizer(tail, add_special_tokens=False)["input_ids"])
  long_text = "apple " * 400 + tail  # "apple" is one word piece.
  kept = "apple " * (ours.max_seq_length - 2 - tail_tokens) + tail
  left = ours.encode([long_text], truncation_side="left")
  right = ours.encode([long_text])
  expected = reference.encode([kept], convert_to_numpy=True)
  assert _cosines(left, expected)[0] >= MIN_COSINE
  assert _cosines(right, expected)[0] < 0.999  # Right truncation drops the tail.


def test_encode_edge_cases_and_compiled_shapes(models):
  ours, _ = models
  assert ours.encode([]).shape == (0, 384)
  out = st.encode_texts(ours.encoder, ours.tokenizer, ["", "short one", "x " * 50],
                        batch_size=2, max_length=32)
  assert out.shape == (3, 384) and np.isfinite(out).all()
  with pytest.raises(MochegInputError, match="text 1 is a NoneType"):
    ours.encode(["fine", None])
  with pytest.raises(ValueError, match="truncation_side"):
    ours.encode(["x"], truncation_side="middle")
  # 40 texts of 1-12 words (3-14 tokens) in 5 batches of 8: one program per length bucket
  # used (8, 10, 12 or 14), not one per batch; the same texts again compile nothing.
  forward = st._forward(nnx.graphdef(ours.encoder))
  before = forward._cache_size()
  rng = random.Random(3)
  texts = [" ".join(["word"] * rng.randint(1, 12)) for _ in range(40)]
  ours.encode(texts, batch_size=8)
  compiled = forward._cache_size() - before
  ours.encode(texts[::-1], batch_size=8)
  assert forward._cache_size() - before == compiled <= 4
  assert st.length_buckets(256) == [8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96,
                                    112, 128, 160, 192, 224, 256]
  assert st.length_buckets(100) == [8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96,
                                    100]
  assert st.length_buckets(256, per_octave=2) == [8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256]


def test_export_is_a_sentence_transformers_folder(models, tmp_path):
  from sentence_transformers import SentenceTransformer
  ours, reference = models
  st.save(ours, tmp_path)
  texts = varied_sentences(24, seed=1)
  expected = reference.encode(texts, convert_to_numpy=True)
  again = SentenceTransformer(str(tmp_path), device="cpu").encode(texts, convert_to_numpy=True)
  assert _cosines(again, expected).min() >= MIN_COSINE
  reloaded = st.load(tmp_path)
  assert (reloaded.max_seq_length, reloaded.encoder.pooling, reloaded.encoder.normalize) == (
      256, "mean", True)


def test_unsupported_modules_and_pooling_are_named(tmp_path):
  # A plain HF folder (no modules.json): mean pooling, no normalisation.
  assert st.read_structure(tmp_path) == {"transformer": tmp_path, "pooling": "mean",
                                         "normalize": False}
  (tmp_path / "1_Pooling").mkdir()
  kind = "sentence_transformers.models."
  modules = [{"idx": 0, "name": "0", "path": "", "type": kind + "Transformer"},
             {"idx": 1, "name": "1", "path": "1_Pooling", "type": kind + "Pooling"},
             {"idx": 2, "name": "2", "path": "2_Dense", "type": kind + "Dense"}]
  (tmp_path / "modules.json").write_text(json.dumps(modules))
  with pytest.raises(MochegInputError, match=r"modules.json: module 2 of type .*Dense"):
    st.read_structure(tmp_path)
  (tmp_path / "modules.json").write_text(json.dumps(modules[:2]))
  (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(
      {"pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": True}))
  with pytest.raises(MochegInputError, match=r"1_Pooling/config.json: .*\['max'\]"):
    st.read_structure(tmp_path)
  (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "cls"}))
  assert st.read_structure(tmp_path)["pooling"] == "cls"
