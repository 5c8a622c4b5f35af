"""grain input pipelines, one per task, over the prepared `mocheg` TFDS data.

Every pipeline: eligible records of a split -> this process's shard -> deterministic
shuffle by seed -> epochs -> per-example transform (random choices seeded by grain from the
dataset seed and the record index, tokenisation, image decoding: all in grain workers) ->
fixed-shape numpy batches (integers int32, claim ids included, as JAX holds them without
x64). The iterator's `get_state()` / `set_state()` let the trainer
checkpoint the input position together with the model.

Records a task cannot use (a claim with no relevant sentence for text retrieval, say) are
left out by an index scan up front and counted in `Pipeline.skipped`, never silently.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Any, Callable, Mapping, Sequence

import grain
from absl import flags
import numpy as np

from mocheg_jax.data import caption_corpus
from mocheg_jax.data import labels
from mocheg_jax.data import length_groups
from mocheg_jax.data import tfds_mocheg
from mocheg_jax.data.vision import decode_image

Example = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ReadAhead:
  """How far grain's reader threads run ahead of the consumer, in elements (every training
  pipeline batches before it iterates, so an element is a whole batch).

  grain's own defaults, 16 threads and 500 elements, read ~500 batches ahead: a tiny main
  job's 4-step trainings tokenised and decoded hundreds of batches each, and on 2 CPU cores
  those threads held the CPU and the GIL while the training loop traced and compiled
  (py-spy: 89% of the job's busy samples were in grain's reader threads). A few batches
  ahead hide the input behind the step; raise both on hosts with many cores.
  """
  threads: int = 2
  batches: int = 4

  @classmethod
  def of(cls, data_config) -> ReadAhead:
    """From a training config's `data` (train/config.py: read_threads, read_ahead_batches)."""
    return cls(data_config.read_threads, data_config.read_ahead_batches)


def iterate(ds: grain.MapDataset, read_ahead: ReadAhead = ReadAhead()) -> grain.IterDataset:
  """`ds` as an IterDataset read `read_ahead` ahead (in reader threads of this process)."""
  if read_ahead.threads < 1 or read_ahead.batches < 1:
    raise ValueError(f"read-ahead threads and batches must be positive, got {read_ahead}")
  return ds.to_iter_dataset(grain.ReadOptions(num_threads=read_ahead.threads,
                                              prefetch_buffer_size=read_ahead.batches))


@dataclasses.dataclass(frozen=True)
class LoaderConfig:
  """How examples are batched and ordered (task-independent)."""
  batch_size: int
  seed: int = 0
  shuffle: bool = True
  num_epochs: int | None = None  # None: repeat forever (training); 1 for evaluation.
  drop_remainder: bool = True
  worker_count: int = 0  # grain worker processes; 0 transforms in the main process.
  read_ahead: ReadAhead = ReadAhead()
  # > 0: batches of examples of similar length, sorted within megabatches of this many
  # global batches (data/length_groups.py; training only, for pipelines that know their
  # examples' lengths); 0: batches drawn freely.
  length_groups: int = 0
  # This process's share (process_batches): default jax.process_index() / process_count().
  shard_index: int | None = None
  shard_count: int | None = None

  @classmethod
  def training(cls, batch_size: int, seed: int, data_config) -> LoaderConfig:
    """A training input's loader: workers and read-ahead from a training config's `data`."""
    return cls(batch_size=batch_size, seed=seed, worker_count=data_config.workers,
               read_ahead=ReadAhead.of(data_config),
               length_groups=data_config.get("length_groups", 0))


@dataclasses.dataclass
class Pipeline:
  dataset: grain.IterDataset
  num_records: int  # Usable records of the split (all processes together).
  skipped: int  # Records of the split that the task cannot use (all processes).
  skip_reason: str

  def __iter__(self):
    return iter(self.dataset)


class _Subset:
  """A random-access view of some indices of a source (picklable for grain workers)."""

  def __init__(self, source, indices: Sequence[int]):
    self._source, self._indices = source, np.asarray(indices, np.int64)

  def __len__(self) -> int:
    return len(self._indices)

  def __getitem__(self, i: int):
    return self._source[int(self._indices[i])]


_local = threading.local()


def _tokenizer(path: str):
  """This thread's tokenizer for `path`, loaded lazily.

  One per thread and per process: an HF fast tokenizer changes its truncation and padding
  state on every call, so sharing one between grain's reader threads corrupts lengths;
  and tokenizers are not shipped to worker processes.
  """
  cache = getattr(_local, "tokenizers", None)
  if cache is None:
    cache = _local.tokenizers = {}
  if path not in cache:
    from mocheg_jax.data.tokenizers import load_tokenizer
    cache[path] = load_tokenizer(path)
  return cache[path]


def _text(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _encode(tokenizer_dir: str, text: str, max_len: int) -> tuple[np.ndarray, np.ndarray]:
  enc = _tokenizer(tokenizer_dir)(text, max_length=max_len, truncation=True,
                                  padding="max_length")
  return (np.asarray(enc["input_ids"], np.int32),
          np.asarray(enc["attention_mask"], np.int32))


def _process_layout(shard_index: int | None, shard_count: int | None) -> tuple[int, int]:
  """(this process's shard, the number of shards): as given, or JAX's process layout."""
  if shard_index is None or shard_count is None:
    import jax  # Only for the process layout; data code runs without devices otherwise.
    return jax.process_index(), jax.process_count()
  return shard_index, shard_count


def process_batches(ds: grain.MapDataset, local_batch: int, drop_remainder: bool = True,
                    shard_index: int | None = None, shard_count: int | None = None,
                    global_map: Callable[[Example], Example] | None = None
                    ) -> grain.MapDataset:
  """This process's rows of every global batch of `ds` (examples in their global order).

  Global batch k is local batches k * shard_count ... k * shard_count + shard_count - 1,
  one per process in process order (as distributed.global_batch assembles them), so the
  global batches, and with them training, do not depend on the number of processes. Each
  process reads only its own rows (MapDataset is lazy), unless `global_map` is given.

  Args:
    shard_index, shard_count: default jax.process_index() / jax.process_count().
    global_map: applied to each whole global batch before this process takes its rows (a
      shape every process must agree on, such as `LengthBuckets`); every process then reads
      every row of the batch.
  """
  shard_index, shard_count = _process_layout(shard_index, shard_count)
  if not 0 <= shard_index < shard_count:
    raise ValueError(f"shard_index {shard_index} is not in [0, {shard_count})")
  if global_map is None:
    return ds.batch(local_batch, drop_remainder=drop_remainder)[shard_index::shard_count]
  rows = slice(shard_index * local_batch, (shard_index + 1) * local_batch)
  return (ds.batch(local_batch * shard_count, drop_remainder=drop_remainder).map(global_map)
          .map(lambda batch: {k: v[rows] for k, v in batch.items()}))


@dataclasses.dataclass(frozen=True)
class LengthBuckets:
  """Cuts a batch's padding to the next multiple of `multiple` of its longest row.

  `fields` maps each mask (1 for tokens, 0 for padding after them) to the fields padded
  with it. A batch padded to a config's maximum length costs the model that length whatever
  its rows hold: the small world's longest training source is 133 tokens of 256, its
  longest ruling outline 154 of 192. The model compiles one program per bucket it meets.
  """
  multiple: int
  fields: tuple[tuple[str, tuple[str, ...]], ...]  # (mask, (fields padded with it)).

  def __post_init__(self):
    if self.multiple < 1:
      raise ValueError(f"length buckets need a positive multiple, got {self.multiple}")

  def __call__(self, batch: Example) -> Example:
    batch = dict(batch)
    for mask_name, names in self.fields:
      mask = batch[mask_name]
      longest = int(np.max(np.nonzero(mask.any(axis=0))[0], initial=-1)) + 1
      length = length_groups.padded_length(longest, self.multiple, mask.shape[1])
      for name in (mask_name, *names):
        batch[name] = batch[name][:, :length]
    return batch


def _source(data_dir: str, config: str, split: str):
  return tfds_mocheg.load(data_dir, config).as_data_source()[split]


def _stack(examples: Sequence[Example]) -> Example:
  return {k: np.stack([e[k] for e in examples]) for k in examples[0]}


class _GroupedBatch:
  """grain map: a global batch of record indices -> this process's rows, transformed (each
  record with its own generator from the seed, the batch number and its place) and, when
  given, `global_map` applied to the whole global batch first."""

  def __init__(self, records, transform, seed: int, rows: slice,
               global_map: Callable[[Example], Example] | None):
    self.records, self.transform, self.seed = records, transform, seed
    self.rows, self.global_map = rows, global_map

  def __call__(self, number: int, indices: np.ndarray) -> Example:
    picked = indices if self.global_map else indices[self.rows]
    batch = _stack([self.transform(self.records[int(i)],
                                   np.random.default_rng([self.seed, number, k]))
                    for k, i in enumerate(picked)])
    if self.global_map:
      batch = {k: v[self.rows] for k, v in self.global_map(batch).items()}
    return batch


def _grouped_batches(records, transform: Callable[[Example, np.random.Generator], Example],
                     length_of: Callable[[Example], int], loader: LoaderConfig,
                     global_map: Callable[[Example], Example] | None) -> grain.MapDataset:
  """This process's rows of length-grouped global batches (`loader.length_groups`). The
  lengths come from one transform of each record (a random transform's draw may differ
  from a batch's: grouping is a cost heuristic, the padding is the batch's own)."""
  if not loader.shuffle or loader.num_epochs is not None or not loader.drop_remainder:
    raise ValueError("length-grouped batches are for training: shuffled, repeated, "
                     "whole batches")
  shard_index, shard_count = _process_layout(loader.shard_index, loader.shard_count)
  lengths = np.fromiter((length_of(transform(records[i], np.random.default_rng(0)))
                         for i in range(len(records))), np.int64, len(records))
  rows = slice(shard_index * loader.batch_size, (shard_index + 1) * loader.batch_size)
  return (length_groups.index_batches(lengths, loader.batch_size * shard_count,
                                      loader.length_groups, loader.seed)
          .map_with_index(_GroupedBatch(records, transform, loader.seed, rows, global_map)))


def _summed_length(example: Example, fields: Sequence[str]) -> int:
  """An example's tokens over its token masks (the length it is grouped by)."""
  return int(sum(example[name].sum() for name in fields))


def _make_pipeline(source, keep: Callable[[Example], bool] | None, skip_reason: str,
                   transform: Callable[[Example, np.random.Generator], Example],
                   loader: LoaderConfig,
                   global_map: Callable[[Example], Example] | None = None,
                   length_of: Callable[[Example], int] | None = None) -> Pipeline:
  """`keep` None: every record is usable (not read to check). `global_map`: see
  `process_batches`. `length_of`: an example's length in tokens, for `loader.length_groups`
  (a pipeline without one refuses them)."""
  eligible = [i for i in range(len(source)) if keep is None or keep(source[i])]
  if not eligible:
    raise ValueError(f"no usable records ({skip_reason}: all {len(source)} records of the "
                     "split were skipped)")
  records = grain.MapDataset.source(_Subset(source, eligible))
  if loader.length_groups:
    if length_of is None:
      raise ValueError("this pipeline does not group batches by length (length_groups "
                       f"{loader.length_groups}; set it to 0)")
    ds = _grouped_batches(records, transform, length_of, loader, global_map)
  else:
    ds = records.seed(loader.seed)
    if loader.shuffle:
      ds = ds.shuffle()
    ds = ds.repeat(loader.num_epochs).random_map(transform)
    ds = process_batches(ds, loader.batch_size, loader.drop_remainder, loader.shard_index,
                         loader.shard_count, global_map)
  iter_ds = iterate(ds, loader.read_ahead)
  if loader.worker_count > 0:
    # grain's workers read absl flags; outside an absl app (notebooks, pytest) nothing has
    # parsed them, so accept their defaults rather than fail.
    if not flags.FLAGS.is_parsed():
      flags.FLAGS.mark_as_parsed()
    iter_ds = iter_ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=loader.worker_count))
  return Pipeline(iter_ds, len(eligible), len(source) - len(eligible), skip_reason)


# ---- text retrieval: (claim, positive sentence, hard negative) ---------------------------
def _text_retrieval_example(record: Example, rng: np.random.Generator, *, tokenizer_dir: str,
                            max_query_len: int, max_doc_len: int,
                            extra_negatives: Mapping[int, Sequence[str]]) -> Example:
  positives = record["relevant_sentences"]
  negatives = [*record["negative_sentences"], *extra_negatives.get(int(record["claim_id"]), ())]
  positive = _text(positives[rng.integers(len(positives))])
  negative = _text(negatives[rng.integers(len(negatives))]) if len(negatives) else ""
  q_ids, q_mask = _encode(tokenizer_dir, _text(record["claim"]), max_query_len)
  p_ids, p_mask = _encode(tokenizer_dir, positive, max_doc_len)
  n_ids, n_mask = _encode(tokenizer_dir, negative, max_doc_len)
  return {"claim_id": np.int32(record["claim_id"]), "query_ids": q_ids, "query_mask": q_mask,
          "positive_ids": p_ids, "positive_mask": p_mask, "negative_ids": n_ids,
          "negative_mask": n_mask, "has_negative": np.bool_(len(negatives) > 0)}


TEXT_RETRIEVAL_LENGTHS = (("query_mask", ("query_ids",)), ("positive_mask", ("positive_ids",)),
                          ("negative_mask", ("negative_ids",)))


def text_retrieval(data_dir: str, split: str, tokenizer_dir: str, loader: LoaderConfig,
                   max_query_len: int = 64, max_doc_len: int = 100,
                   extra_negatives: Mapping[int, Sequence[str]] | None = None,
                   length_multiple: int = 0) -> Pipeline:
  """`extra_negatives`: {claim id: more hard negative texts} beside the record's own.
  `length_multiple`: 0 pads every batch to max_query_len / max_doc_len; N pads each global
  batch's claims, positives and negatives to the next multiple of N of their longest."""
  transform = functools.partial(_text_retrieval_example, tokenizer_dir=tokenizer_dir,
                                max_query_len=max_query_len, max_doc_len=max_doc_len,
                                extra_negatives=extra_negatives or {})
  buckets = LengthBuckets(length_multiple, TEXT_RETRIEVAL_LENGTHS) if length_multiple else None
  return _make_pipeline(_source(data_dir, "claims", split),
                        lambda r: len(r["relevant_sentences"]) > 0,
                        "no relevant KB sentence", transform, loader, buckets,
                        length_of=functools.partial(_summed_length, fields=tuple(
                            mask for mask, _ in TEXT_RETRIEVAL_LENGTHS)))


# ---- caption pre-training: (caption, picture) ---------------------------------------------
def _caption_example(record: Example, rng: np.random.Generator, *, tokenizer_dir: str,
                     max_query_len: int) -> Example:
  del rng  # Each record is one fixed pair.
  q_ids, q_mask = _encode(tokenizer_dir, record["caption"], max_query_len)
  # "claim_id" is the pair's row: the image retriever's loss masks copies of one key.
  return {"claim_id": np.int32(record["index"]), "query_ids": q_ids, "query_mask": q_mask,
          "image": caption_corpus.normalise(record["pixels"])}


def caption_pairs(corpus_dir: str, tokenizer_dir: str, loader: LoaderConfig,
                  max_query_len: int = 77) -> Pipeline:
  """Batches of a built caption corpus (data/caption_corpus.py) in the image retriever's
  batch layout."""
  transform = functools.partial(_caption_example, tokenizer_dir=tokenizer_dir,
                                max_query_len=max_query_len)
  return _make_pipeline(caption_corpus.CaptionSource(corpus_dir), None, "", transform, loader)


# ---- image retrieval: (claim, positive KB image) ----------------------------------------
def _image_retrieval_example(record: Example, rng: np.random.Generator, *, tokenizer_dir: str,
                             max_query_len: int, image_size: int) -> Example:
  images = record["relevant_image_bytes"]
  q_ids, q_mask = _encode(tokenizer_dir, _text(record["claim"]), max_query_len)
  pixels = decode_image(images[rng.integers(len(images))], image_size)
  return {"claim_id": np.int32(record["claim_id"]), "query_ids": q_ids, "query_mask": q_mask,
          "image": pixels}


def image_retrieval(data_dir: str, split: str, tokenizer_dir: str, loader: LoaderConfig,
                    max_query_len: int = 77, image_size: int = 224) -> Pipeline:
  transform = functools.partial(_image_retrieval_example, tokenizer_dir=tokenizer_dir,
                                max_query_len=max_query_len, image_size=image_size)
  return _make_pipeline(_source(data_dir, "claims", split),
                        lambda r: len(r["relevant_image_bytes"]) > 0,
                        "no relevant KB image", transform, loader)


# ---- verification: claim with padded text and image evidence ----------------------------
def _verification_example(record: Example, rng: np.random.Generator, *, tokenizer_dir: str,
                          max_claim_len: int, max_evidence_len: int, max_text_evidence: int,
                          max_images: int, image_size: int) -> Example:
  del rng  # Evidence order is kept; the cap keeps the first items (documented in config).
  claim_ids, claim_mask = _encode(tokenizer_dir, _text(record["claim"]), max_claim_len)
  text_ids = np.zeros((max_text_evidence, max_evidence_len), np.int32)
  text_mask = np.zeros((max_text_evidence, max_evidence_len), np.int32)
  evidence = list(record["evidence"])[:max_text_evidence]
  for i, snippet in enumerate(evidence):
    text_ids[i], text_mask[i] = _encode(tokenizer_dir, _text(snippet), max_evidence_len)
  pixels = np.zeros((max_images, image_size, image_size, 3), np.float32)
  proofs = list(record["proof_image_bytes"])[:max_images]
  for i, data in enumerate(proofs):
    pixels[i] = decode_image(data, image_size)
  return {
      "claim_id": np.int32(record["claim_id"]), "claim_ids": claim_ids,
      "claim_mask": claim_mask, "evidence_ids": text_ids, "evidence_mask": text_mask,
      "evidence_present": np.arange(max_text_evidence) < len(evidence),
      "images": pixels, "image_present": np.arange(max_images) < len(proofs),
      "label": np.int32(record["label"]),
  }


def verification(data_dir: str, split: str, tokenizer_dir: str, loader: LoaderConfig,
                 max_claim_len: int = 77, max_evidence_len: int = 77,
                 max_text_evidence: int = 8, max_images: int = 4,
                 image_size: int = 224) -> Pipeline:
  transform = functools.partial(
      _verification_example, tokenizer_dir=tokenizer_dir, max_claim_len=max_claim_len,
      max_evidence_len=max_evidence_len, max_text_evidence=max_text_evidence,
      max_images=max_images, image_size=image_size)
  return _make_pipeline(_source(data_dir, "claims", split), lambda r: True, "none",
                        transform, loader)


# ---- explanation generation: source and target token ids --------------------------------
def explanation_source_ids(tokenizer, label: str, claim: str, evidence: str, max_len: int,
                           left_truncation: bool = False) -> list[int]:
  """Token ids of `"{label} </s> {claim} </s> {evidence}"` in at most `max_len` tokens.

  By default the evidence is what gets cut, so the label and claim always survive;
  `left_truncation=True` reproduces the reference, which drops tokens from the start.
  """
  bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
  encode = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
  prefix = encode(label) + [eos] + encode(" " + claim) + [eos]
  body = prefix + encode(" " + evidence)
  room = max_len - 2
  if left_truncation:
    kept = body[-room:] if len(body) > room else body
  else:
    kept = prefix[:room] + body[len(prefix):][:max(0, room - len(prefix))]
  return [bos] + kept + [eos]


def _pad(ids: Sequence[int], max_len: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  out = np.full((max_len,), pad_id, np.int32)
  out[:len(ids)] = ids
  return out, (np.arange(max_len) < len(ids)).astype(np.int32)


def _explanation_example(record: Example, rng: np.random.Generator, *, tokenizer_dir: str,
                         max_source_len: int, max_target_len: int,
                         left_truncation: bool) -> Example:
  del rng
  tokenizer = _tokenizer(tokenizer_dir)
  label = labels.LABEL_NAMES[int(record["label"])]
  evidence = " ".join(_text(e) for e in record["evidence"])
  source = explanation_source_ids(tokenizer, label, _text(record["claim"]), evidence,
                                  max_source_len, left_truncation)
  target = tokenizer(_text(record["explanation"]), max_length=max_target_len,
                     truncation=True)["input_ids"]
  pad = tokenizer.pad_token_id
  source_ids, source_mask = _pad(source, max_source_len, pad)
  target_ids, target_mask = _pad(target, max_target_len, pad)
  return {"claim_id": np.int32(record["claim_id"]), "source_ids": source_ids,
          "source_mask": source_mask, "target_ids": target_ids, "target_mask": target_mask,
          "label": np.int32(record["label"])}


EXPLANATION_LENGTHS = (("source_mask", ("source_ids",)), ("target_mask", ("target_ids",)))


def explanation(data_dir: str, split: str, tokenizer_dir: str, loader: LoaderConfig,
                max_source_len: int = 512, max_target_len: int = 400,
                left_truncation: bool = False, length_multiple: int = 0) -> Pipeline:
  """length_multiple: 0 pads every batch to max_source_len / max_target_len; N pads each
  global batch's sources and targets to the next multiple of N of its longest."""
  transform = functools.partial(
      _explanation_example, tokenizer_dir=tokenizer_dir, max_source_len=max_source_len,
      max_target_len=max_target_len, left_truncation=left_truncation)
  buckets = LengthBuckets(length_multiple, EXPLANATION_LENGTHS) if length_multiple else None
  return _make_pipeline(_source(data_dir, "claims", split),
                        lambda r: len(_text(r["explanation"]).strip()) > 0,
                        "no gold explanation", transform, loader, buckets,
                        length_of=functools.partial(_summed_length, fields=tuple(
                            mask for mask, _ in EXPLANATION_LENGTHS)))


TASKS: dict[str, Callable[..., Pipeline]] = {
    "text_retrieval": text_retrieval,
    "image_retrieval": image_retrieval,
    "verification": verification,
    "explanation": explanation,
}
