"""Batched, jitted encoding of texts and images into float32 embeddings, in input order.

The batching core is model-agnostic: it takes a jitted forward function and the output
width. Texts are tokenised a chunk at a time, sorted by length (longest first), cut into
batches padded to a few bucketed shapes (lengths: four per octave, 8, 10, 12, 14, 16, 20,
...; batch sizes: powers of two up to `batch_size`), so jit compiles a bounded number of
programs whatever the data. Every batch of a chunk is dispatched before any result is read
back, so tokenising (or decoding images of) the next chunk overlaps the device's work.
A `sink` callback takes each batch's outputs instead, for outputs that are not one vector
per input (the token states of mocheg_jax/verification/features.py).

On top of it: CLIP text and image encoding, and `load_encoder(folder)`, which picks the
family from config.json's model_type (a sentence-transformers / BERT folder, or CLIP) for
scripts/encode.py. BERT sentence encoding is `sentence_transformers.encode_texts`.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import pathlib
from typing import Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from PIL import Image

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.data.vision import decode_image
from mocheg_jax.models import clip
from mocheg_jax.parallel import distributed

MIN_BUCKET = 8
PER_OCTAVE = 4  # Padded lengths per octave (length_buckets).
# ids [B, L] int32, mask [B, L] int32 (1 = token) -> embeddings [B, D] (dispatched, not read).
TextForward = Callable[[np.ndarray, np.ndarray], jax.Array]
# pixels [B, H, W, C] float32 -> embeddings [B, D].
ImageForward = Callable[[np.ndarray], jax.Array]
# Receives each batch's results instead of the default [N, width] array: (input indices
# [n], host outputs [n, ...] with the padding rows cut, tokens per row [n] for texts or None
# for images). For outputs that are not one vector per input (token states).
Sink = Callable[[np.ndarray, np.ndarray, "np.ndarray | None"], None]
# Image decoding errors from Pillow (SyntaxError: some truncated PNGs; bombs: huge images).
_IMAGE_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)


# ---- the batching core ----------------------------------------------------------------------
def length_buckets(max_length: int, min_bucket: int = MIN_BUCKET,
                   per_octave: int = PER_OCTAVE) -> list[int]:
  """Padded lengths: `per_octave` evenly spaced lengths per octave from `min_bucket` (by
  default 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, ...), capped by max_length.

  With 4 per octave a batch is at most a fifth padding (about 7% on the Mocheg-like
  sentences of benchmarks/bench_bert.py, against 15% with 2 per octave, where the
  reference pads each batch to its longest text), for twice the compiled shapes.
  """
  out, p = [], min_bucket
  while p < max_length:
    out += [p + p * i // per_octave for i in range(per_octave)]
    p *= 2
  return sorted({b for b in out if b < max_length}) + [max_length]


def batch_buckets(batch_size: int) -> list[int]:
  """Padded batch sizes: powers of two below `batch_size`, and `batch_size` itself."""
  return sorted({min(batch_size, 1 << i) for i in range(batch_size.bit_length() + 1)})


def _bucket(n: int, buckets: Sequence[int]) -> int:
  return next(b for b in buckets if b >= n)


def _check_batching(batch_size: int, chunk_batches: int) -> None:
  if batch_size < 1:
    raise ValueError(f"batch_size must be positive, not {batch_size}")
  if chunk_batches < 1:
    raise ValueError(f"chunk_batches must be positive, not {chunk_batches}")


# (output rows, a dispatched batch result, tokens per row or None)
Pending = list[tuple[np.ndarray, jax.Array, "np.ndarray | None"]]


def _run_chunks(count: int, chunk_size: int, dispatch: Callable[[int], Pending],
                sink: Sink) -> None:
  """Calls `dispatch(start)` per chunk, reading a chunk's results back only once the next
  chunk is dispatched (reading back waits for the device; the queue stays full)."""
  pending = dispatch(0) if count else []
  for start in range(chunk_size, count + chunk_size, chunk_size):
    following = dispatch(start) if start < count else []
    for rows, result, lengths in pending:
      # During training the parameters span every process's devices: gather (collective).
      sink(rows, distributed.to_host(result)[:len(rows)], lengths)
    pending = following


def _collect(count: int, width: int, sink: Sink | None) -> tuple[Sink, np.ndarray | None]:
  """The caller's sink, or one filling a float32 [count, width] array (returned too)."""
  if sink is not None:
    return sink, None
  out = np.zeros((count, width), np.float32)

  def fill(rows: np.ndarray, values: np.ndarray, lengths: np.ndarray | None) -> None:
    del lengths
    out[rows] = values

  return fill, out


def check_texts(texts: Iterable[str]) -> list[str]:
  """The texts as a list; a non-string is an error naming its index."""
  texts = list(texts)
  for i, t in enumerate(texts):
    if not isinstance(t, str):
      raise MochegInputError(f"text {i} is a {type(t).__name__}, not a string")
  return texts


def tokenize(tokenizer, texts: Sequence[str], max_length: int,
             truncation_side: str = "right") -> list[list[int]]:
  """Token ids with special tokens, truncated to `max_length` on the given side."""
  previous = tokenizer.truncation_side
  tokenizer.truncation_side = truncation_side
  try:
    return tokenizer(list(texts), truncation=True, max_length=max_length, padding=False,
                     return_attention_mask=False, return_token_type_ids=False)["input_ids"]
  finally:
    tokenizer.truncation_side = previous


def run_text_encoder(forward: TextForward, tokenizer, texts: Sequence[str], *, width: int,
                     max_length: int, batch_size: int = 64, truncation_side: str = "right",
                     pad_id: int | None = None, chunk_batches: int = 32,
                     sink: Sink | None = None) -> np.ndarray | None:
  """Embeds texts with any jitted text encoder: float32 [N, width], rows in input order.

  Args:
    forward: ids, mask (both int32 [B, L], right-padded) -> [B, width]; called once per
      batch, with a few distinct shapes (see the module docstring).
    tokenizer: a fast tokenizer (special tokens are added, as the model expects).
    texts: strings; empty strings are texts too (special tokens only).
    width: the embedding size.
    max_length: tokens per text after truncation, special tokens included.
    batch_size: the most rows per forward pass.
    truncation_side: "right" keeps the beginning of long texts, "left" keeps the end.
    pad_id: the id padded positions get (masked out anyway); None: the tokenizer's pad
      token, else 0.
    chunk_batches: texts are tokenised and length-sorted `batch_size * chunk_batches` at a
      time, which bounds host memory and overlaps tokenising with computing.
    sink: None: return the [N, width] array. Else `forward` may return any [B, ...] batch
      (e.g. token states [B, L, D]); each batch goes to `sink(rows, outputs, lengths)`
      (lengths = tokens per text, special tokens included) and None is returned.
  """
  if truncation_side not in ("right", "left"):
    raise ValueError(f"truncation_side must be 'right' or 'left', not {truncation_side!r}")
  _check_batching(batch_size, chunk_batches)
  texts = check_texts(texts)
  buckets = length_buckets(max_length)
  sizes = batch_buckets(batch_size)
  if pad_id is None:
    pad_id = tokenizer.pad_token_id or 0
  chunk_size = batch_size * chunk_batches

  def dispatch(start: int) -> Pending:
    ids = tokenize(tokenizer, texts[start:start + chunk_size], max_length, truncation_side)
    lengths = np.fromiter((len(x) for x in ids), np.int64, len(ids))
    order = np.argsort(-lengths, kind="stable")  # Longest first, as sentence-transformers.
    pending = []
    for b in range(0, len(order), batch_size):
      rows = order[b:b + batch_size]
      length = _bucket(int(lengths[rows[0]]), buckets)
      n = _bucket(len(rows), sizes)
      batch = np.full((n, length), pad_id, np.int32)
      mask = np.zeros((n, length), np.int32)
      for j, r in enumerate(rows):
        batch[j, :lengths[r]] = ids[r]
        mask[j, :lengths[r]] = 1
      pending.append((rows + start, forward(batch, mask), lengths[rows]))
    return pending

  sink, out = _collect(len(texts), width, sink)
  _run_chunks(len(texts), chunk_size, dispatch, sink)
  return out


def run_image_encoder(forward: ImageForward, load: Callable[[int], np.ndarray], count: int, *,
                      width: int, batch_size: int = 64, chunk_batches: int = 2,
                      threads: int | None = None,
                      sink: Sink | None = None) -> np.ndarray | None:
  """Embeds `count` images: float32 [count, width], rows in input order.

  Args:
    forward: pixels [B, H, W, C] -> [B, width]; one program per padded batch size.
    load: index -> pixels [H, W, C] (decoded and normalised); called from `threads` threads
      (Pillow releases the GIL while decoding and resizing), so it must be thread-safe.
    count: the number of images.
    width: the embedding size.
    batch_size: the most images per forward pass.
    chunk_batches: images decoded ahead, in batches (each 224px image is 0.6 MB).
    threads: decoding threads; None: min(8, CPU count).
    sink: as in `run_text_encoder` (lengths None): outputs of any [B, ...] shape go to
      `sink(rows, outputs, None)` and None is returned.
  """
  _check_batching(batch_size, chunk_batches)
  sizes = batch_buckets(batch_size)
  chunk_size = batch_size * chunk_batches
  threads = threads or min(8, os.cpu_count() or 1)
  with concurrent.futures.ThreadPoolExecutor(threads) as pool:

    def dispatch(start: int) -> Pending:
      indices = range(start, min(start + chunk_size, count))
      pixels = list(pool.map(load, indices))
      pending = []
      for b in range(0, len(pixels), batch_size):
        part = pixels[b:b + batch_size]
        batch = np.zeros((_bucket(len(part), sizes), *part[0].shape), np.float32)
        batch[:len(part)] = part
        pending.append((np.arange(start + b, start + b + len(part)), forward(batch), None))
      return pending

    sink, out = _collect(count, width, sink)
    _run_chunks(count, chunk_size, dispatch, sink)
    return out


# ---- CLIP -----------------------------------------------------------------------------------
@functools.lru_cache(maxsize=16)
def _clip_forwards(graphdef: nnx.GraphDef) -> tuple[Callable, Callable]:
  """Jitted (text, image) embedding functions per model structure."""

  @jax.jit
  def text(state, ids, mask):
    return nnx.merge(graphdef, state).encode_text(ids, mask).astype(jnp.float32)

  @jax.jit
  def image(state, pixels):
    return nnx.merge(graphdef, state).encode_image(pixels).astype(jnp.float32)

  return text, image


def clip_max_length(model: clip.CLIPModel, tokenizer) -> int:
  """The default text length: min(tokenizer.model_max_length, max_position_embeddings)."""
  return min(int(tokenizer.model_max_length), model.config.text.max_position_embeddings)


def check_clip_tokenizer(model: clip.CLIPModel, tokenizer, source: str = "tokenizer") -> None:
  """The tokenizer must end texts with the EOS id the text tower pools at.

  A mismatch would silently pool the first token's state instead. (Legacy configs with
  eos_token_id 2 pool at the highest id; those are not checked.)
  """
  eos = model.config.text.eos_token_id
  if eos == clip.LEGACY_EOS_TOKEN_ID:
    return
  ids = tokenizer("")["input_ids"]
  if not ids or ids[-1] != eos:
    raise MochegInputError(
        f"{source}: the tokenizer ends a text with id {ids[-1] if ids else None}, but the "
        f"CLIP config's text_config.eos_token_id is {eos} (the token whose state is pooled)")


def encode_clip_texts(model: clip.CLIPModel, tokenizer, texts: Sequence[str], *,
                      batch_size: int = 64, max_length: int | None = None,
                      truncation_side: str = "right") -> np.ndarray:
  """CLIP text embeddings (HF get_text_features: projected, not normalised), [N, P].

  Args:
    max_length: tokens per text, special tokens included; None: `clip_max_length` (77 for
      the released checkpoints).
  """
  positions = model.config.text.max_position_embeddings
  if max_length is None:
    max_length = clip_max_length(model, tokenizer)
  if not 2 <= max_length <= positions:
    raise ValueError(f"max_length {max_length} must be in [2, {positions}]")
  graphdef, state = nnx.split(model)
  text, _ = _clip_forwards(graphdef)
  # Padding with EOS (as CLIP's own tokenizer) or anything else is equal: the first EOS is
  # pooled and the mask hides padding from real tokens.
  return run_text_encoder(lambda ids, mask: text(state, ids, mask), tokenizer, texts,
                          width=model.config.projection_dim, max_length=max_length,
                          batch_size=batch_size, truncation_side=truncation_side)


def read_image(path: str | os.PathLike, size: int, *, where: str = "") -> np.ndarray:
  """Decodes one image file to CLIP pixels [size, size, 3].

  Raises:
    MochegInputError: `where` (e.g. "list.txt:3"), the path and why it cannot be read.
  """
  prefix = f"{where}: " if where else ""
  try:
    with open(path, "rb") as f:
      data = f.read()
    return decode_image(data, size)
  except _IMAGE_ERRORS as e:
    if isinstance(e, Image.UnidentifiedImageError):  # Its text names a BytesIO object.
      reason = "not an image format Pillow can decode"
    else:
      reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
    raise MochegInputError(f"{prefix}cannot read image {os.fspath(path)!r}: {reason}") from e


def encode_clip_images(model: clip.CLIPModel, paths: Sequence[str | os.PathLike], *,
                       batch_size: int = 64, source: str | None = None) -> np.ndarray:
  """CLIP image embeddings (HF get_image_features: projected, not normalised), [N, P].

  Args:
    paths: image files (any format Pillow reads), resized and centre-cropped as CLIP's
      image processor does.
    source: the list file the paths come from; errors then say "<source>:<line>" (path i
      is line i + 1), else "image <i>".

  Raises:
    MochegInputError: an empty path, a missing file (checked for all paths before any
      work) or an undecodable image, naming its line and path.
  """
  paths = [os.fspath(p) for p in paths]
  where = (lambda i: f"{source}:{i + 1}") if source else (lambda i: f"image {i}")
  for i, path in enumerate(paths):
    if not path.strip():
      raise MochegInputError(f"{where(i)}: empty image path")
    if not os.path.isfile(path):
      what = "is not a file" if os.path.exists(path) else "does not exist"
      raise MochegInputError(f"{where(i)}: cannot read image {path!r}: it {what}")
  size = model.config.vision.image_size
  graphdef, state = nnx.split(model)
  _, image = _clip_forwards(graphdef)
  return run_image_encoder(lambda pixels: image(state, pixels),
                           lambda i: read_image(paths[i], size, where=where(i)), len(paths),
                           width=model.config.projection_dim, batch_size=batch_size)


def encode_clip_pixels(model: clip.CLIPModel, pixels: np.ndarray, *,
                       batch_size: int = 64) -> np.ndarray:
  """CLIP image embeddings of decoded, normalised pictures [N, H, W, 3], as
  `encode_clip_images` (projected, not normalised), [N, P]."""
  graphdef, state = nnx.split(model)
  _, image = _clip_forwards(graphdef)
  return run_image_encoder(lambda x: image(state, x), lambda i: pixels[i], len(pixels),
                           width=model.config.projection_dim, batch_size=batch_size)


# ---- a checkpoint folder --------------------------------------------------------------------
class FolderEncoder:
  """Texts (BERT/SBERT or CLIP) or images (CLIP) -> float32 embeddings, for one folder."""

  def __init__(self, folder: pathlib.Path, family: str, model, tokenizer=None,
               max_length: int | None = None):
    self.folder, self.family, self.model = folder, family, model
    self._tokenizer, self._max_length = tokenizer, max_length

  @property
  def tokenizer(self):
    if self._tokenizer is None:  # CLIP folders for images only need not have one.
      from mocheg_jax.data.tokenizers import load_tokenizer
      self._tokenizer = load_tokenizer(self.folder)
      check_clip_tokenizer(self.model, self._tokenizer, source=str(self.folder))
    return self._tokenizer

  @property
  def positions(self) -> int:
    """The longest text the model takes, in tokens."""
    if self.family == "clip":
      return self.model.config.text.max_position_embeddings
    return self.model.encoder.config.max_position_embeddings

  def encode_texts(self, texts: Sequence[str], *, batch_size: int = 64,
                   max_length: int | None = None,
                   truncation_side: str = "right") -> np.ndarray:
    """Embeddings [N, D] of `texts`; `max_length` None: the folder's default (SBERT's
    max_seq_length, CLIP's position count capped by the tokenizer's model_max_length)."""
    if max_length is not None and not 2 <= max_length <= self.positions:
      raise MochegInputError(f"max_length {max_length} is out of range for {self.folder}: "
                             f"expected 2 to {self.positions} (max_position_embeddings)")
    if self.family == "clip":
      return encode_clip_texts(self.model, self.tokenizer, texts, batch_size=batch_size,
                               max_length=max_length, truncation_side=truncation_side)
    from mocheg_jax.models import sentence_transformers
    return sentence_transformers.encode_texts(
        self.model.encoder, self.model.tokenizer, texts, batch_size=batch_size,
        max_length=max_length or self.model.max_seq_length, truncation_side=truncation_side)

  def encode_images(self, paths: Sequence[str], *, batch_size: int = 64,
                    source: str | None = None) -> np.ndarray:
    """Embeddings [N, P] of image files (CLIP only); see `encode_clip_images`."""
    if self.family != "clip":
      raise MochegInputError(f"{self.folder} holds a {self.family} text model; encoding "
                             "images needs a CLIP model")
    return encode_clip_images(self.model, paths, batch_size=batch_size, source=source)


def load_encoder(folder: str | os.PathLike, *, images: bool = False,
                 dtype=jnp.float32) -> FolderEncoder:
  """Loads a folder for encoding: a sentence-transformers folder (modules.json), or an HF
  (or scripts/convert.py orbax) folder whose config.json says model_type bert or clip.

  Args:
    folder: the model folder.
    images: images will be encoded, so only CLIP will do (checked before loading weights).
    dtype: compute dtype.

  Raises:
    MochegInputError: not a folder, an unsupported model_type (or not CLIP for images),
      or unusable files.
  """
  from mocheg_jax.models import sentence_transformers, zoo
  from mocheg_jax.models.hf import clip as hf_clip
  path = pathlib.Path(folder)
  if not path.is_dir():
    what = "is not a folder" if path.exists() else "does not exist"
    raise MochegInputError(f"{path}: model folder {what}")
  if (path / sentence_transformers.MODULES_FILE).is_file():
    kind = "bert"  # The transformer may live in a subfolder; modules.json says where.
  else:
    kind = zoo.model_type(path)
  if images and kind != "clip":
    raise MochegInputError(f"{path} holds a {kind} model, which encodes texts only; "
                           "encoding images needs a CLIP model")
  if kind == "bert":
    return FolderEncoder(path, kind, sentence_transformers.load(path, dtype=dtype))
  if kind == "clip":
    return FolderEncoder(path, kind, hf_clip.load(path, dtype=dtype))
  raise MochegInputError(f"{path / 'config.json'}: model_type {kind!r} cannot encode; "
                         "expected a bert (sentence-transformers) or clip model")


def read_lines(path: str | os.PathLike) -> list[str]:
  """One item per line (UTF-8; "\\n" or "\\r\\n" line ends). Empty lines are items too (an
  empty text); a final line end does not start another item, so an empty file has none.

  Raises:
    MochegInputError: the file is missing or is not UTF-8 (naming the line).
  """
  path = pathlib.Path(path)
  if not path.is_file():
    what = "is not a file" if path.exists() else "does not exist"
    raise MochegInputError(f"{path}: input file {what}")
  data = path.read_bytes()
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = data[:e.start].count(b"\n") + 1
    raise MochegInputError(f"{path}:{line}: not valid UTF-8 ({e.reason} at byte "
                           f"{e.start})") from e
  if text.startswith("\ufeff"):
    text = text[1:]  # A byte-order mark is not part of the first text.
  lines = text.split("\n")
  if lines[-1] == "":
    lines.pop()
  return [line[:-1] if line.endswith("\r") else line for line in lines]
