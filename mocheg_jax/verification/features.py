"""A store on disk of frozen-CLIP token states for verification: encoded once, reused.

The stance model (stance.py) reads CLIP token states, not pixels or token ids: the text
tower's last hidden states (after its final layer norm) for claims and text evidence, and
the vision tower's patch states (no class token, before the post-layernorm) for images.
CLIP is frozen, so every distinct text and image is encoded once, here, and every epoch and
run after that reads the states back memory-mapped. Texts may instead go through a frozen
BERT/MiniLM sentence encoder (its last hidden states; `build_store(text_model=...)`), for
worlds without a pretrained CLIP whose text tower keeps the words apart. A model that trains
the vision tower's last blocks (vision_top.py) gets the tokens entering them instead
(`build_store(image_blocks=...)`: class token and patches, [1 + P, Dv] per image).

Layout of a store folder:
```
manifest.json             written last: format, fingerprint (who encoded it), dtype,
                          max_text_len, text_dim, image_dim, patches, the finished parts
part-00000/               one part per build that had something new to encode
  text_keys.json          the texts (the keys), a JSON list in row order
  text_offsets.npy        int64 [n + 1]: text i's tokens are rows offsets[i]:offsets[i+1]
  text_states.npy         [total_tokens, text_dim]: only real tokens (special ones included)
  text_ids.npy            int32 [total_tokens]: their token ids (exact-match features)
  image_keys.json         absolute image paths, in row order
  image_states.npy        [m, patches, image_dim]
  text_embeds.npy         only with embed_dim > 0: [n, embed_dim] CLIP's text embedding of
  image_embeds.npy        each text / image (projected, unit length; `build_store(
                          embeddings=True)`), for claim-image similarities
part-00001/ ...           (a later build's new keys)
```
A part is written under a temporary name (`.tmp-part-*`), renamed into place when complete,
and only then listed in a new manifest.json (itself written to a temporary name and
renamed). So a crash leaves at most an unlisted part: a folder without manifest.json is not
opened as a store, and an earlier finished store stays what its manifest says. The next
build removes unlisted parts and temporary folders (only names of these two patterns).

Building again into a finished store with the same fingerprint, dtype and max_text_len
encodes only the keys it lacks (gold evidence first, system evidence later: one store);
anything else that differs is an error that names the difference. Two builds must not run
into one folder at the same time. A store inside a folder copied from elsewhere is opened
(and extended) with `moved` (utils/paths.py): its fingerprint and image keys name the old
folder, and are compared and looked up as if they named the new one.

Devices: the encoder is jitted with bucketed shapes (models/encoding.py) and runs data
parallel over `devices` (default: every local device): parameters replicated, each batch
split over a one-axis mesh (its rows padded to a multiple of the device count).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import shutil
from typing import Any, Callable, Sequence, Union

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.models import bert
from mocheg_jax.models import clip
from mocheg_jax.models import encoding
from mocheg_jax.utils import files, paths

FORMAT = "mocheg-verification-features"
VERSION = 3  # 2: parts hold text_ids.npy; 3: the manifest's embed_dim (CLIP embeddings).
MANIFEST = "manifest.json"
DTYPES = ("float16", "float32")
_PART = re.compile(r"part-\d{5}")
_TMP_PREFIX = ".tmp-part-"
# Fields that must agree for a build to add to a store (the fingerprint too).
_LAYOUT_FIELDS = ("dtype", "max_text_len", "text_dim", "image_dim", "patches", "embed_dim")


@dataclasses.dataclass(frozen=True)
class StoreManifest:
  fingerprint: dict[str, Any]
  dtype: str
  max_text_len: int
  text_dim: int
  image_dim: int
  patches: int
  embed_dim: int = 0  # CLIP's projection size when the parts hold embeddings, else 0.
  parts: tuple[dict[str, Any], ...] = ()  # {"name", "texts", "tokens", "images"} each
  format: str = FORMAT
  version: int = VERSION

  @property
  def num_texts(self) -> int:
    return sum(p["texts"] for p in self.parts)

  @property
  def num_tokens(self) -> int:
    return sum(p["tokens"] for p in self.parts)

  @property
  def num_images(self) -> int:
    return sum(p["images"] for p in self.parts)

  def to_json(self) -> dict[str, Any]:
    return dict(dataclasses.asdict(self), parts=list(self.parts))

  @classmethod
  def from_json(cls, data: Any, path: str) -> StoreManifest:
    names = [f.name for f in dataclasses.fields(cls)]
    if not isinstance(data, dict) or data.get("format") != FORMAT:
      raise MochegInputError(f"{path}: not a verification feature store manifest")
    if data.get("version") != VERSION:
      raise MochegInputError(f"{path}: format version {data.get('version')}, this code reads "
                             f"{VERSION}; rebuild the store")
    missing = [n for n in names if n not in data]
    if missing:
      raise MochegInputError(f"{path}: manifest lacks {', '.join(missing)}")
    return cls(**dict({n: data[n] for n in names}, parts=tuple(data["parts"])))


# ---- files ---------------------------------------------------------------------------------
def _write_json(path: str, data: Any) -> None:
  files.write_json(path, data, ensure_ascii=False)


def _read_json(path: str) -> Any:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except FileNotFoundError:
    raise MochegInputError(f"{path}: missing") from None
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise MochegInputError(f"{path}: not valid JSON ({e})") from None


def _read_manifest(store_dir: str) -> StoreManifest | None:
  path = os.path.join(store_dir, MANIFEST)
  if not os.path.isfile(path):
    return None
  return StoreManifest.from_json(_read_json(path), path)


def _canonical(fingerprint: dict) -> dict:
  if not isinstance(fingerprint, dict):
    raise TypeError(f"fingerprint must be a dict, not {type(fingerprint).__name__}")
  try:
    return json.loads(json.dumps(fingerprint, sort_keys=True))
  except (TypeError, ValueError) as e:
    raise TypeError(f"fingerprint must be JSON-serialisable: {e}") from None


def _differences(found: dict, wanted: dict) -> list[str]:
  return [f"{k}: store has {found.get(k)!r}, asked for {wanted.get(k)!r}"
          for k in sorted(set(found) | set(wanted)) if found.get(k) != wanted.get(k)]


# ---- encoding ------------------------------------------------------------------------------
@functools.lru_cache(maxsize=16)
def _state_forwards(graphdef: nnx.GraphDef, dtype: str, image_blocks: int | None = None
                    ) -> tuple[Callable, Callable]:
  """Jitted (text states, image states) functions per model structure (see build_store for
  `image_blocks`)."""

  @jax.jit
  def text(state, ids, mask):
    return text_hidden_states(nnx.merge(graphdef, state), ids, mask).astype(dtype)

  @jax.jit
  def image(state, pixels):
    model = nnx.merge(graphdef, state)
    if image_blocks is None:
      return model.image_features(pixels).patches.astype(dtype)
    vision = model.vision_model
    return vision.blocks(vision.embed(pixels), stop=image_blocks).astype(dtype)

  return text, image


TextModel = Union[clip.CLIPModel, bert.SentenceEncoder]


def text_hidden_states(model: TextModel, ids: jax.Array, mask: jax.Array) -> jax.Array:
  """Last hidden states [B, L, D] of a CLIP text tower or a BERT/MiniLM sentence encoder."""
  if isinstance(model, clip.CLIPModel):
    return model.text_features(ids, mask).hidden
  hidden, _ = model.bert(ids, mask, deterministic=True)
  return hidden


def text_width(model: TextModel) -> int:
  return (model.config.text.hidden_size if isinstance(model, clip.CLIPModel)
          else model.config.hidden_size)


def _text_positions(model: TextModel) -> int:
  return (model.config.text.max_position_embeddings if isinstance(model, clip.CLIPModel)
          else model.config.max_position_embeddings)


class _Placement:
  """Puts parameters (replicated) and batches (split by rows) on the devices."""

  def __init__(self, devices: Sequence[jax.Device] | None):
    devices = list(devices) if devices is not None else jax.local_devices()
    if not devices:
      raise ValueError("no devices to encode on")
    self.count = len(devices)
    self.mesh = Mesh(np.asarray(devices), ("data",))
    self.replicated = NamedSharding(self.mesh, P())
    self.rows = NamedSharding(self.mesh, P("data"))

  def params(self, state):
    return jax.device_put(state, self.replicated)

  def batch(self, x: np.ndarray) -> jax.Array:
    extra = -len(x) % self.count  # Padding rows: their outputs are cut by the caller.
    if extra:
      x = np.concatenate([x, np.zeros((extra, *x.shape[1:]), x.dtype)])
    return jax.device_put(x, self.rows)


def encode_text_states(model: TextModel, tokenizer, texts: Sequence[str], *,
                       max_length: int, batch_size: int, dtype: str,
                       sink: encoding.Sink, devices: Sequence[jax.Device] | None = None
                       ) -> None:
  """Last hidden states [B, L, Dt] of `texts` (CLIP text tower or a sentence encoder), per
  batch into `sink`."""
  graphdef, state = nnx.split(model)
  text, _ = _state_forwards(graphdef, dtype)
  place = _Placement(devices)
  state = place.params(state)
  encoding.run_text_encoder(
      lambda ids, mask: text(state, place.batch(ids), place.batch(mask)), tokenizer, texts,
      width=text_width(model), max_length=max_length, batch_size=batch_size,
      sink=sink)


def encode_image_states(model: clip.CLIPModel, paths: Sequence[str], *, batch_size: int,
                        dtype: str, sink: encoding.Sink,
                        devices: Sequence[jax.Device] | None = None,
                        image_blocks: int | None = None) -> None:
  """Vision-tower states of image files, per batch into `sink`: patch states [B, P, Dv], or
  with `image_blocks` the class token and patches after that many blocks [B, 1 + P, Dv]."""
  graphdef, state = nnx.split(model)
  _, image = _state_forwards(graphdef, dtype, image_blocks)
  place = _Placement(devices)
  state = place.params(state)
  size = model.config.vision.image_size
  encoding.run_image_encoder(
      lambda pixels: image(state, place.batch(pixels)),
      lambda i: encoding.read_image(paths[i], size, where=f"image {i}"), len(paths),
      width=model.config.vision.hidden_size, batch_size=batch_size, sink=sink)


# ---- building ------------------------------------------------------------------------------
def _clean(store_dir: str, listed: set[str]) -> None:
  """Removes what an interrupted build left: temporary and unlisted part folders."""
  for name in os.listdir(store_dir):
    if name.startswith(_TMP_PREFIX) or (_PART.fullmatch(name) and name not in listed):
      shutil.rmtree(os.path.join(store_dir, name), ignore_errors=True)


def _write_embeddings(tmp: str, model: clip.CLIPModel, clip_tokenizer, texts: list[str],
                      paths: list[str], *, max_text_len: int, batch_size: int, dtype: str
                      ) -> None:
  """CLIP's unit-length text and image embeddings of a part's keys (one device: a second,
  cheap pass; only the projected vectors are kept)."""
  unit = lambda x: (x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
                    ).astype(dtype)
  width = model.config.projection_dim
  length = min(max_text_len, model.config.text.max_position_embeddings)
  np.save(os.path.join(tmp, "text_embeds.npy"), unit(
      encoding.encode_clip_texts(model, clip_tokenizer, texts, batch_size=batch_size,
                                 max_length=length) if texts else np.zeros((0, width))))
  np.save(os.path.join(tmp, "image_embeds.npy"), unit(
      encoding.encode_clip_images(model, paths, batch_size=batch_size) if paths
      else np.zeros((0, width))))


def _write_part(tmp: str, model: clip.CLIPModel, text_model: TextModel, tokenizer,
                texts: list[str], paths: list[str], *, max_text_len: int, batch_size: int,
                dtype: str, devices, image_blocks: int | None, patches: int,
                clip_tokenizer=None) -> dict[str, int]:
  os.makedirs(tmp)
  info = {"texts": len(texts), "tokens": 0, "images": len(paths)}
  if texts:
    ids = encoding.tokenize(tokenizer, texts, max_text_len)
    lengths = np.fromiter(map(len, ids), np.int64, len(texts))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    info["tokens"] = int(offsets[-1])
    np.save(os.path.join(tmp, "text_ids.npy"),
            np.fromiter((i for row in ids for i in row), np.int32, info["tokens"]))
    states = np.lib.format.open_memmap(
        os.path.join(tmp, "text_states.npy"), "w+", np.dtype(dtype),
        (info["tokens"], text_width(text_model)))

    def text_sink(rows, values, got):
      for r, v, n in zip(rows, values, got):
        if n != lengths[r]:  # Same tokenizer and settings: a mismatch is a bug.
          raise AssertionError(f"text {r}: {n} tokens, expected {lengths[r]}")
        states[offsets[r]:offsets[r + 1]] = v[:n]

    encode_text_states(text_model, tokenizer, texts, max_length=max_text_len,
                       batch_size=batch_size, dtype=dtype, sink=text_sink, devices=devices)
    states.flush()
    del states
    np.save(os.path.join(tmp, "text_offsets.npy"), offsets)
  _write_json(os.path.join(tmp, "text_keys.json"), texts)
  if paths:
    vision = model.config.vision
    images = np.lib.format.open_memmap(
        os.path.join(tmp, "image_states.npy"), "w+", np.dtype(dtype),
        (len(paths), patches, vision.hidden_size))

    def image_sink(rows, values, _):
      images[rows] = values

    encode_image_states(model, paths, batch_size=batch_size, dtype=dtype, sink=image_sink,
                        devices=devices, image_blocks=image_blocks)
    images.flush()
    del images
  _write_json(os.path.join(tmp, "image_keys.json"), paths)
  if clip_tokenizer is not None:
    _write_embeddings(tmp, model, clip_tokenizer, texts, paths, max_text_len=max_text_len,
                      batch_size=batch_size, dtype=dtype)
  return info


def build_store(out_dir: str | os.PathLike, clip_model: clip.CLIPModel, tokenizer,
                texts: Sequence[str], image_paths: Sequence[str | os.PathLike], *,
                fingerprint: dict, max_text_len: int = 77, batch_size: int = 64,
                dtype: str = "float16", devices: Sequence[jax.Device] | None = None,
                log: Callable[[str], None] | None = None,
                text_model: bert.SentenceEncoder | None = None,
                image_blocks: int | None = None, moved: paths.Moved = None,
                embeddings: bool = False, clip_tokenizer=None) -> StoreManifest:
  """Encodes the texts and images a store lacks and adds them as a new part.

  Args:
    out_dir: the store folder (created if needed; may hold a finished store to extend).
    clip_model: the frozen CLIP.
    tokenizer: its tokenizer (must end texts with the token the text tower pools).
    texts: claims and text evidence items; duplicates are encoded once.
    image_paths: image files; keyed by absolute path; duplicates are encoded once.
    fingerprint: who encoded it (model, checkpoint, step...), JSON data compared for
      equality with an existing store's.
    max_text_len: tokens per text, special tokens included (longer texts are cut).
    batch_size: the most texts or images per forward pass.
    dtype: "float16" or "float32" storage (and device output) type.
    devices: the devices to split batches over; None: every local device.
    log: receives one line per part written.
    text_model: encodes the texts instead of CLIP's text tower (a BERT/MiniLM sentence
      encoder; `tokenizer` is then its tokenizer). Images always go through CLIP.
    image_blocks: None stores what the frozen stance model reads, the vision tower's patch
      states (no class token, before the post-layernorm). A number k in [0, layers] stores
      the class token and patches after the first k blocks ([1 + P, Dv] per image) for a
      model that trains the remaining blocks; put k in the fingerprint.
    moved: (old root, new root) when the store's folder was copied from the old root.
    embeddings: also store CLIP's text and image embeddings (FeatureStore.text_embedding,
      image_embedding); a store holds them in every part or in none.
    clip_tokenizer: CLIP's tokenizer for the text embeddings; needed with `embeddings` and
      a `text_model` (else `tokenizer` is CLIP's).

  Returns:
    The store's manifest after the build.

  Raises:
    MochegInputError: an existing store of another fingerprint or layout; a missing or
      unreadable image file (checked before anything is encoded).
  """
  store_dir = os.fspath(out_dir)
  if dtype not in DTYPES:
    raise ValueError(f"dtype must be one of {DTYPES}, not {dtype!r}")
  text_encoder = clip_model if text_model is None else text_model
  positions = _text_positions(text_encoder)
  if not 2 <= max_text_len <= positions:
    raise ValueError(f"max_text_len {max_text_len} must be in [2, {positions}] "
                     "(the text encoder's max_position_embeddings)")
  if text_model is None:
    encoding.check_clip_tokenizer(clip_model, tokenizer)
  vision = clip_model.config.vision
  if image_blocks is not None and not 0 <= image_blocks <= vision.num_hidden_layers:
    raise ValueError(f"image_blocks {image_blocks} must be in [0, "
                     f"{vision.num_hidden_layers}] (the vision tower's blocks)")
  patches = vision.num_patches + (image_blocks is not None)  # With the class token.
  if embeddings:
    clip_tokenizer = tokenizer if text_model is None else clip_tokenizer
    if clip_tokenizer is None:
      raise ValueError("embeddings with a separate text_model need CLIP's clip_tokenizer")
    encoding.check_clip_tokenizer(clip_model, clip_tokenizer, "clip_tokenizer")
  else:
    clip_tokenizer = None
  wanted = StoreManifest(_canonical(fingerprint), dtype, int(max_text_len),
                         text_width(text_encoder), vision.hidden_size, patches,
                         clip_model.config.projection_dim if embeddings else 0)
  os.makedirs(store_dir, exist_ok=True)
  manifest = _read_manifest(store_dir)
  have_texts: set[str] = set()
  have_images: set[str] = set()
  if manifest is not None:
    found = {f: getattr(manifest, f) for f in ("fingerprint", *_LAYOUT_FIELDS)}
    asked = {f: getattr(wanted, f) for f in ("fingerprint", *_LAYOUT_FIELDS)}
    problems = [] if paths.same_record(found, asked, moved) else _differences(
        paths.relocate(found, moved), paths.relocate(asked, moved))
    if problems:
      raise MochegInputError(f"{store_dir}: the feature store was built differently; "
                             f"use another folder or the same settings ({'; '.join(problems)})")
    for part in manifest.parts:
      have_texts.update(_read_json(os.path.join(store_dir, part["name"], "text_keys.json")))
      have_images.update(paths.relocate(
          _read_json(os.path.join(store_dir, part["name"], "image_keys.json")), moved))
  else:
    manifest = wanted
  _clean(store_dir, {p["name"] for p in manifest.parts})

  new_texts = list(dict.fromkeys(t for t in encoding.check_texts(texts) if t not in have_texts))
  new_paths = list(dict.fromkeys(
      p for p in (os.path.abspath(os.fspath(x)) for x in image_paths) if p not in have_images))
  for path in new_paths:
    if not os.path.isfile(path):
      what = "is not a file" if os.path.exists(path) else "does not exist"
      raise MochegInputError(f"{store_dir}: cannot encode image {path!r}: it {what}")
  if not new_texts and not new_paths:
    if not os.path.isfile(os.path.join(store_dir, MANIFEST)):
      _write_json(os.path.join(store_dir, MANIFEST), manifest.to_json())
    return manifest

  name = f"part-{len(manifest.parts):05d}"
  tmp = os.path.join(store_dir, f"{_TMP_PREFIX}{name}")
  info = _write_part(tmp, clip_model, text_encoder, tokenizer, new_texts, new_paths,
                     max_text_len=max_text_len, batch_size=batch_size, dtype=dtype,
                     devices=devices, image_blocks=image_blocks, patches=patches,
                     clip_tokenizer=clip_tokenizer)
  _write_json(os.path.join(tmp, "part.json"), info)
  os.replace(tmp, os.path.join(store_dir, name))
  manifest = dataclasses.replace(manifest, parts=(*manifest.parts, dict(name=name, **info)))
  _write_json(os.path.join(store_dir, MANIFEST), manifest.to_json())
  if log is not None:
    log(f"{store_dir}/{name}: encoded {info['texts']} texts ({info['tokens']} tokens) and "
        f"{info['images']} images")
  return manifest


# ---- reading -------------------------------------------------------------------------------
class FeatureStore:
  """A finished store, read memory-mapped (see `open_store`). Picklable: the maps are
  reopened lazily after unpickling (grain worker processes). With `moved`, image keys under
  the old root are looked up under the new one."""

  def __init__(self, store_dir: str, manifest: StoreManifest, moved: paths.Moved = None):
    self.dir, self.manifest = store_dir, manifest
    self._texts: dict[str, tuple[int, int]] = {}  # key -> (part, row)
    self._images: dict[str, tuple[int, int]] = {}
    self._offsets: list[np.ndarray | None] = []
    for p, part in enumerate(manifest.parts):
      folder = os.path.join(store_dir, part["name"])
      text_keys = _read_json(os.path.join(folder, "text_keys.json"))
      image_keys = paths.relocate(_read_json(os.path.join(folder, "image_keys.json")), moved)
      if len(text_keys) != part["texts"] or len(image_keys) != part["images"]:
        raise MochegInputError(f"{folder}: {len(text_keys)} text keys and {len(image_keys)} "
                               f"image keys; the manifest says {part['texts']} and "
                               f"{part['images']}")
      self._texts.update((k, (p, i)) for i, k in enumerate(text_keys))
      self._images.update((k, (p, i)) for i, k in enumerate(image_keys))
      offsets = None
      if part["texts"]:
        offsets = np.load(os.path.join(folder, "text_offsets.npy"))
        if offsets.shape != (part["texts"] + 1,) or offsets[-1] != part["tokens"]:
          raise MochegInputError(f"{folder}/text_offsets.npy does not match the manifest")
      self._offsets.append(offsets)
    self._maps: dict[tuple[int, str], np.ndarray] = {}
    for p, part in enumerate(manifest.parts):  # Checks every file's shape (headers only).
      if part["texts"]:
        self._map(p, "text_states")
        self._map(p, "text_ids")
      if part["images"]:
        self._map(p, "image_states")
      if manifest.embed_dim:
        self._map(p, "text_embeds")
        self._map(p, "image_embeds")

  def __getstate__(self):
    return dict(self.__dict__, _maps={})

  def _map(self, p: int, name: str) -> np.ndarray:
    key = (p, name)
    if key not in self._maps:
      part, m = self.manifest.parts[p], self.manifest
      path = os.path.join(self.dir, part["name"], name + ".npy")
      try:
        array = np.load(path, mmap_mode="r")
      except (OSError, ValueError) as e:
        raise MochegInputError(f"{path}: cannot read ({e})") from None
      shape, dtype = {"text_states": ((part["tokens"], m.text_dim), m.dtype),
                      "text_ids": ((part["tokens"],), "int32"),
                      "image_states": ((part["images"], m.patches, m.image_dim), m.dtype),
                      "text_embeds": ((part["texts"], m.embed_dim), m.dtype),
                      "image_embeds": ((part["images"], m.embed_dim), m.dtype)}[name]
      if array.shape != shape or array.dtype != np.dtype(dtype):
        raise MochegInputError(f"{path}: {array.dtype}{list(array.shape)}, the manifest says "
                               f"{dtype}{list(shape)}")
      self._maps[key] = array
    return self._maps[key]

  @property
  def num_texts(self) -> int:
    return len(self._texts)

  @property
  def num_images(self) -> int:
    return len(self._images)

  def has_text(self, key: str) -> bool:
    return key in self._texts

  def has_image(self, path: str | os.PathLike) -> bool:
    return os.path.abspath(os.fspath(path)) in self._images

  def _text_row(self, key: str) -> tuple[int, int]:
    try:
      return self._texts[key]
    except KeyError:
      raise MochegInputError(f"{self.dir}: text not in the feature store: {key[:80]!r}; build "
                             "the store with every claim and text item") from None

  def _where_text(self, key: str) -> tuple[int, int, int]:
    p, i = self._text_row(key)
    offsets = self._offsets[p]
    return p, int(offsets[i]), int(offsets[i + 1])

  def text_lengths(self, keys: Sequence[str]) -> np.ndarray:
    """Tokens stored per text, int64 [n]."""
    return np.asarray([e - s for _, s, e in map(self._where_text, keys)], np.int64)

  def text(self, keys: Sequence[str], length: int | None = None
           ) -> tuple[np.ndarray, np.ndarray]:
    """Token states and mask of texts, right-padded with zeros.

    Args:
      keys: texts that were given to `build_store`.
      length: the padded length; None: the longest of these (at least 1). Longer texts
        are cut to it (their first `length` tokens).

    Returns:
      states [n, L, text_dim] in the store dtype, and mask bool [n, L].
    """
    where = [self._where_text(k) for k in keys]
    if length is None:
      length = max([e - s for _, s, e in where], default=0) or 1
    states = np.zeros((len(keys), length, self.manifest.text_dim), self.manifest.dtype)
    mask = np.zeros((len(keys), length), bool)
    for row, (p, start, end) in enumerate(where):
      n = min(end - start, length)
      states[row, :n] = self._map(p, "text_states")[start:start + n]
      mask[row, :n] = True
    return states, mask

  def token_ids(self, keys: Sequence[str], length: int) -> np.ndarray:
    """Token ids int32 [n, length] of texts, in the rows of `text(keys, length)`; -1 on
    padding."""
    out = np.full((len(keys), length), -1, np.int32)
    for row, (p, start, end) in enumerate(map(self._where_text, keys)):
      n = min(end - start, length)
      out[row, :n] = self._map(p, "text_ids")[start:start + n]
    return out

  def _where_image(self, path: str | os.PathLike) -> tuple[int, int]:
    key = os.path.abspath(os.fspath(path))
    try:
      return self._images[key]
    except KeyError:
      raise MochegInputError(f"{self.dir}: image not in the feature store: {key!r}") from None

  def image(self, paths: Sequence[str | os.PathLike]) -> np.ndarray:
    """Patch states [n, patches, image_dim] of image files given to `build_store`."""
    out = np.zeros((len(paths), self.manifest.patches, self.manifest.image_dim),
                   self.manifest.dtype)
    for row, path in enumerate(paths):
      p, i = self._where_image(path)
      out[row] = self._map(p, "image_states")[i]
    return out

  def _embeddings(self, rows: Sequence[tuple[int, int]], name: str) -> np.ndarray:
    """Rows (part, row) of a store's `name` embeddings, [n, embed_dim]."""
    if not self.manifest.embed_dim:
      raise MochegInputError(f"{self.dir}: the feature store holds no CLIP embeddings; "
                             "build it with embeddings=True")
    out = np.zeros((len(rows), self.manifest.embed_dim), self.manifest.dtype)
    for row, (p, i) in enumerate(rows):
      out[row] = self._map(p, name)[i]
    return out

  def text_embedding(self, keys: Sequence[str]) -> np.ndarray:
    """CLIP's unit text embeddings [n, embed_dim] (a store built with embeddings)."""
    return self._embeddings([self._text_row(k) for k in keys], "text_embeds")

  def image_embedding(self, paths: Sequence[str | os.PathLike]) -> np.ndarray:
    """CLIP's unit image embeddings [n, embed_dim] (a store built with embeddings)."""
    return self._embeddings([self._where_image(p) for p in paths], "image_embeds")


def open_store(store_dir: str | os.PathLike, expect_fingerprint: dict | None = None,
               moved: paths.Moved = None) -> FeatureStore:
  """Opens a finished store (memory-mapped; nothing is loaded but keys and offsets);
  `moved`: the store's folder was copied from the old root (see the module's notes).

  Raises:
    MochegInputError: the folder is missing or holds no finished store (an interrupted
      first build), its files disagree with the manifest, or its fingerprint is not
      `expect_fingerprint` (when given).
  """
  store_dir = os.fspath(store_dir)
  if not os.path.isdir(store_dir):
    raise MochegInputError(f"{store_dir}: feature store folder does not exist")
  manifest = _read_manifest(store_dir)
  if manifest is None:
    raise MochegInputError(f"{store_dir}: not a finished feature store (no {MANIFEST}; was "
                           "its build interrupted?); build it again")
  if expect_fingerprint is not None:
    wanted = _canonical(expect_fingerprint)
    if not paths.same_record(manifest.fingerprint, wanted, moved):
      problems = _differences(paths.relocate(manifest.fingerprint, moved),
                              paths.relocate(wanted, moved))
      raise MochegInputError(f"{store_dir}: the store was encoded by another model "
                             f"({'; '.join(problems)})")
  return FeatureStore(store_dir, manifest, moved)
