"""The cross-encoder reranker: its training task and batched, jitted reranking.

A BERT-family `CrossEncoder` reads "[CLS] claim [SEP] sentence [SEP]" and gives one
relevance logit. Training pairs, per train claim with a relevant KB sentence:
  * positives: its relevant sentences (text qrels);
  * hard negatives: `hard_negatives` drawn from the top `mine_top_k` sentences a first-stage
    retriever returns for the claim, minus its positives;
  * random negatives: `random_negatives` KB sentences drawn uniformly, minus its positives.
The first stage (`rerank.retriever`) is a trained text bi-encoder's workdir, or "" for BM25
(mocheg_jax/retrieval/bm25.py; random only if that module is missing), or "random" (no hard
negatives; dev candidates are the gold sentences hidden among random ones, so the "before"
figures are a random order). Mining searches the sentences of `rerank.max_corpus` (every
relevant sentence plus random ones; 0: the whole KB), runs once per workdir and is cached
in WORKDIR/mined_negatives.json together with the dev candidates, so a resumed run (and
`load_trained`) never mines again.

Loss (`rerank.loss`):
  * "bce" (the reference's): binary cross-entropy on the logit with `pos_weight` on the
    positive term, exactly torch's BCEWithLogitsLoss(pos_weight). The reference repeats the
    positives floor(n_neg / n_pos) times and sets pos_weight to the remaining fraction, so
    positives weigh as much as negatives in all; `pos_weight <= 0` (the default) gives that
    same balance in one factor, n_neg / n_pos of our training pairs, without repeating
    examples. `batch_size` counts pairs.
  * "listwise" (beyond the paper): one group per (train claim, relevant sentence): the
    sentence first, then `hard_negatives` + `random_negatives` negatives drawn as above;
    softmax cross-entropy of the group's logits with the relevant sentence as the target
    (a localized contrastive estimate). Why: a reranker ranks, and a pointwise loss spends
    its steps calibrating each logit on its own; the listwise one only asks the relevant
    sentence to beat the first stage's own confusions (on the synthetic worlds, the
    articles' restatements of the claim), side by side. `batch_size` counts groups.

Dev: the val claims' top `eval_candidates` from the same first stage are reranked; the
evaluator reports recall/NDCG@k, MRR@10, the un-cut TREC ndcg/map over the candidates and
`candidate_auc` after reranking and, prefixed "before_", of the first stage's own order of
the same candidates, plus `candidates_recall` (the ceiling both share).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
from typing import Any, Callable, Mapping, Sequence

import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import flags
from flax import nnx

from mocheg_jax.data import length_groups
from mocheg_jax.data import pipelines
from mocheg_jax.data.mocheg import MochegRelease
from mocheg_jax.data.report import MochegInputError
from mocheg_jax.data.tokenizers import load_tokenizer, minilm_dir
from mocheg_jax.metrics import retrieval as retrieval_metrics
from mocheg_jax.models import bert
from mocheg_jax.models import encoding
from mocheg_jax.models import sentence_transformers as st
from mocheg_jax.models.hf import bert as hf_bert
from mocheg_jax.models.hf import convert
from mocheg_jax.parallel import distributed
from mocheg_jax.retrieval import evaluation
from mocheg_jax.retrieval import mining
from mocheg_jax.retrieval import text_task
from mocheg_jax.train.data import prepared_data
from mocheg_jax.train.task import Evaluator, Task
from mocheg_jax.utils.progress import Progress

TRAIN_SPLIT, DEV_SPLIT = "train", "val"
MINED_VERSION = 1
Ranked = list[tuple[str, float]]


def rerank_config() -> ml_collections.ConfigDict:
  r = ml_collections.ConfigDict()
  r.retriever = ""  # Text-retriever workdir; "": BM25; "random": no first stage.
  r.retriever_checkpoint = "best"  # Which of its checkpoints: best | latest.
  r.mine_top_k = 30  # First-stage results that hard negatives are drawn from.
  r.hard_negatives = 8  # Per claim.
  r.random_negatives = 4  # Per claim.
  r.loss = "bce"  # "bce" (the reference's, per pair) or "listwise" (per group): see above.
  r.pos_weight = 0.0  # bce: <= 0: n_negatives / n_positives of the training pairs.
  r.max_len = 128  # Tokens per (claim, sentence) pair, longest-first truncation.
  # > 0: each training batch padded to the next multiple of this of its longest pair (one
  # program per width met); 0: to max_len.
  r.length_multiple = 0
  r.max_corpus = 20000  # Sentences searched when mining (relevant + random); 0: all.
  r.eval_candidates = 50  # First-stage candidates per dev claim.
  r.eval_batch_size = 128
  r.mine_batch_size = 128  # Bi-encoder encoding batch while mining.
  return r


def config_defaults() -> dict:
  """This task's config sections (train.task.config_defaults: old checkpoints still load)."""
  return {"model": text_task.model_config(), "rerank": rerank_config()}


# ---- loss -------------------------------------------------------------------------------
def bce_with_logits(logits: jax.Array, labels: jax.Array, pos_weight: float | jax.Array = 1.0
                    ) -> jax.Array:
  """Mean of -[w * y * log s(x) + (1 - y) * log(1 - s(x))], torch's BCEWithLogitsLoss."""
  x, y = logits.astype(jnp.float32), labels.astype(jnp.float32)
  # log s(x) = -softplus(-x) and log(1 - s(x)) = -softplus(x), stable for any x.
  return jnp.mean(pos_weight * y * jax.nn.softplus(-x) + (1.0 - y) * jax.nn.softplus(x))


def listwise_cross_entropy(logits: jax.Array) -> jax.Array:
  """Mean over groups [B, G] of -log softmax(logits)[:, 0]: the first member is the target."""
  x = logits.astype(jnp.float32)
  return jnp.mean(jax.nn.logsumexp(x, axis=-1) - x[:, 0])


LOSSES = ("bce", "listwise")


def auto_pos_weight(labels: np.ndarray) -> float:
  positives = int(np.sum(labels > 0))
  if not positives:
    raise ValueError("no positive training pairs: pos_weight is undefined")
  return (len(labels) - positives) / positives


# ---- where the cross-encoder comes from ----------------------------------------------------
@dataclasses.dataclass(frozen=True)
class CrossSource:
  config: bert.BertConfig
  tokenizer_dir: str
  weights: Callable[[], dict] | None  # A nested subset of the CrossEncoder's parameters.
  has_head: bool  # The weights include a trained relevance head.


def tokenizer_dir(m: ml_collections.ConfigDict, wordpiece_dir: str) -> str:
  """The tokenizer folder of a `text_task.model_config()` block, without loading weights."""
  if m.init == "random":
    return wordpiece_dir
  folder = minilm_dir() if m.init == "minilm" else m.init
  return str(st.read_structure(folder)["transformer"])


def cross_source(m: ml_collections.ConfigDict, wordpiece_dir: str) -> CrossSource:
  """`model.init`: "random", "minilm" (its BERT body, a fresh head), a local HF
  cross-encoder folder (BertForSequenceClassification, 1 label: body and head) or any other
  local BERT / sentence-transformers folder (body only). Weights load lazily."""
  if m.init == "random":
    return CrossSource(text_task.bert_source(m, wordpiece_dir).config, wordpiece_dir, None,
                       False)
  folder = tokenizer_dir(m, wordpiece_dir)
  raw = convert.read_config(folder)
  config = bert.BertConfig.from_hf(raw, source=os.path.join(folder, "config.json"))
  labels = len(raw["id2label"]) if raw.get("id2label") else int(raw.get("num_labels", 2))
  is_cross = "BertForSequenceClassification" in (raw.get("architectures") or ()) and labels == 1
  if is_cross:
    weights = lambda: nnx.state(hf_bert.load(folder, head="cross_encoder"),  # noqa: E731
                                nnx.Param).to_pure_dict()
  else:
    weights = lambda: {"bert": nnx.state(hf_bert.load(folder, head="model"),  # noqa: E731
                                         nnx.Param).to_pure_dict()}
  return CrossSource(config, folder, weights, is_cross)


# ---- the world: claims, qrels and the sentences searched -----------------------------------
@dataclasses.dataclass
class World:
  ids: list[str]  # The searched KB sentences (relevant + random up to max_corpus).
  texts: list[str]
  train: list[tuple[str, str, list[str]]]  # (claim id, claim, relevant ids present).
  dev: list[tuple[str, str]]  # (claim id, claim) of val claims with qrels.
  dev_qrels: dict[str, dict[str, int]]
  skipped: int  # Train claims without a relevant sentence in the KB.


def load_world(release_dir: str, max_corpus: int, seed: int) -> World:
  release = MochegRelease(release_dir)
  sentences = [(s.corpus_id, s.text) for s in release.iter_sentences()]
  train_qrels = {str(c): j for c, j in release.text_qrels(TRAIN_SPLIT).items()}
  dev_qrels = {str(c): j for c, j in release.text_qrels(DEV_SPLIT).items()}
  both = {**{"t" + k: v for k, v in train_qrels.items()}, **dev_qrels}
  keep = evaluation.candidate_corpus([i for i, _ in sentences], both, max_corpus, seed)
  ids, texts = [sentences[i][0] for i in keep], [sentences[i][1] for i in keep]
  present = set(ids)
  train, skipped = [], 0
  for c in release.claims(TRAIN_SPLIT):
    judged = train_qrels.get(str(c.claim_id), {})
    positives = sorted(d for d, rel in judged.items() if rel > 0 and d in present)
    if positives:
      train.append((str(c.claim_id), c.claim, positives))
    else:
      skipped += 1
  dev = [(str(c.claim_id), c.claim) for c in release.claims(DEV_SPLIT)
         if str(c.claim_id) in dev_qrels]
  return World(ids, texts, train, dev, dev_qrels, skipped)


# ---- mining (once per workdir) -------------------------------------------------------------
def mining_method(retriever: str) -> str:
  if retriever == "random":
    return "random"
  return "bi-encoder" if retriever else "bm25"


def _first_stage(r: ml_collections.ConfigDict, world: World, queries: dict[str, str], k: int,
                 log: Callable[[str], None]) -> tuple[dict[str, Ranked], int | None]:
  """Top-k (sentence id, score) per query key, and the retriever's step (bi-encoder)."""
  method = mining_method(r.retriever)
  keys = list(queries)
  if method == "bm25":
    from mocheg_jax.retrieval import bm25
    log(f"rerank: mining with BM25 over {len(world.ids)} sentences")
    return bm25.BM25.build(world.ids, world.texts).run(queries, k), None
  from mocheg_jax.train.restore import load_trained  # Imports the trainer; only here.
  trained = load_trained(r.retriever, r.retriever_checkpoint)
  encoder = getattr(trained.model, "encoder", None)
  if not isinstance(encoder, bert.SentenceEncoder) or "retrieval" not in trained.config:
    raise MochegInputError(f"rerank.retriever {r.retriever!r}: not a text retriever's "
                           f"workdir (its task is {trained.config.task!r})")
  data = prepared_data(trained.config, r.retriever, log=lambda _: None)
  tokenizer = load_tokenizer(tokenizer_dir(trained.config.model, data.wordpiece))
  rc = trained.config.retrieval
  positions = encoder.config.max_position_embeddings
  log(f"rerank: mining with the bi-encoder of {r.retriever} (step {trained.step}) over "
      f"{len(world.ids)} sentences")
  encode = lambda texts, n: st.encode_texts(  # noqa: E731
      encoder, tokenizer, texts, batch_size=r.mine_batch_size, max_length=min(n, positions))
  docs = encode(world.texts, rc.max_doc_len)
  claims = encode([queries[q] for q in keys], rc.max_query_len)
  return evaluation.dense_run(keys, claims, world.ids, docs, k), trained.step


def mine(r: ml_collections.ConfigDict, world: World, seed: int,
         log: Callable[[str], None] = print) -> dict[str, Any]:
  """{"train": {claim: [hard negative candidates, best first]}, "dev": {claim: [[id, first
  stage score], ...]}, "retriever_step": step or None}."""
  method = mining_method(r.retriever)
  if method == "random":
    dev, present = {}, set(world.ids)
    for cid, _ in world.dev:
      rng = np.random.default_rng([seed, int(cid)])
      gold = [d for d, rel in world.dev_qrels[cid].items() if rel > 0 and d in present]
      gold = gold[:r.eval_candidates]
      draws = rng.choice(len(world.ids), min(len(world.ids), r.eval_candidates + len(gold)),
                         replace=False)
      others = [d for d in (world.ids[i] for i in draws) if d not in gold]
      pool = gold + others[:r.eval_candidates - len(gold)]
      dev[cid] = [[pool[i], float(-rank)] for rank, i in enumerate(rng.permutation(len(pool)))]
    return {"train": {cid: [] for cid, _, _ in world.train}, "dev": dev,
            "retriever_step": None}
  queries = {"t" + cid: claim for cid, claim, _ in world.train}
  queries.update({"d" + cid: claim for cid, claim in world.dev})
  run, step = _first_stage(r, world, queries, max(r.mine_top_k, r.eval_candidates), log)
  return {"train": {cid: [d for d, _ in run["t" + cid][:r.mine_top_k]]
                    for cid, _, _ in world.train},
          "dev": {cid: [[d, float(s)] for d, s in run["d" + cid][:r.eval_candidates]]
                  for cid, _ in world.dev},
          "retriever_step": step}


def mining_settings(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """What the cache depends on; a cache made with other settings is an error."""
  r = config.rerank
  method = mining_method(r.retriever)
  return {"version": MINED_VERSION, "method": method,
          "retriever": os.path.abspath(r.retriever) if method == "bi-encoder" else "",
          "retriever_checkpoint": r.retriever_checkpoint if method == "bi-encoder" else "",
          "mine_top_k": r.mine_top_k, "eval_candidates": r.eval_candidates,
          "max_corpus": r.max_corpus, "seed": config.seed,
          "data": mining.world_name(config)}


# ---- training pairs and their grain pipeline -------------------------------------------------
@dataclasses.dataclass
class Pairs:
  claims: list[str]
  claim_ids: np.ndarray  # [C] int32
  sentences: list[str]  # Only the sentences some pair uses.
  pairs: np.ndarray  # [N, 3] int32: claim row, sentence row, label (1 / 0).
  pos_weight: float


def _draw_negatives(world: World, ranked: Sequence[str], row: Mapping[str, int],
                    skip: set[str], hard: int, random: int, rng: np.random.Generator
                    ) -> list[str]:
  """Up to `hard` of the first stage's candidates (in their order) and then `random` KB
  sentences, none in `skip` and none twice."""
  skip = set(skip)
  pool = [d for d in ranked if d not in skip and d in row]
  chosen = [pool[i] for i in sorted(rng.choice(len(pool), min(hard, len(pool)),
                                               replace=False))]
  skip.update(chosen)
  draws = rng.choice(len(world.ids), min(len(world.ids), 2 * random + len(skip)),
                     replace=False)
  return chosen + [d for d in (world.ids[i] for i in draws) if d not in skip][:random]


def training_pairs(world: World, mined: Mapping[str, list[str]], hard: int, random: int,
                   seed: int) -> Pairs:
  row = {d: i for i, d in enumerate(world.ids)}
  used: dict[int, int] = {}  # World row -> sentence row.
  out = []
  for c, (cid, _, positives) in enumerate(world.train):
    rng = np.random.default_rng([seed, int(cid)])
    chosen = _draw_negatives(world, mined.get(cid, []), row, set(positives), hard, random,
                             rng)
    for d, label in [(p, 1) for p in positives] + [(n, 0) for n in chosen]:
      out.append((c, used.setdefault(row[d], len(used)), label))
  pairs = np.asarray(out, np.int32).reshape(-1, 3)
  return Pairs([claim for _, claim, _ in world.train],
               np.asarray([int(cid) for cid, _, _ in world.train], np.int32),
               [world.texts[i] for i in used], pairs, auto_pos_weight(pairs[:, 2]))


@dataclasses.dataclass
class Groups:
  claims: list[str]
  claim_ids: np.ndarray  # [C] int32
  sentences: list[str]  # Only the sentences some group uses.
  claim_rows: np.ndarray  # [N] int32: each group's claim row.
  members: np.ndarray  # [N, G] int32 sentence rows: the relevant one, then the negatives.


def training_groups(world: World, mined: Mapping[str, list[str]], hard: int, random: int,
                    seed: int) -> Groups:
  """One group per (train claim, relevant sentence), its negatives drawn as the pairs' are
  (none relevant to the claim); a first stage with too few candidates is made up with
  random sentences, so every group has 1 + hard + random members."""
  size = 1 + hard + random
  if size < 2:
    raise ValueError("a listwise group needs at least one negative: hard_negatives + "
                     "random_negatives is 0")
  if len(world.ids) < size:
    raise ValueError(f"{len(world.ids)} sentences searched: too few for groups of {size}")
  row = {d: i for i, d in enumerate(world.ids)}
  used: dict[int, int] = {}  # World row -> sentence row.
  claim_rows, members = [], []
  for c, (cid, _, positives) in enumerate(world.train):
    for k, positive in enumerate(positives):
      rng = np.random.default_rng([seed, int(cid), k])
      ranked = mined.get(cid, [])
      chosen = _draw_negatives(world, ranked, row, set(positives), hard, random, rng)
      if len(chosen) < size - 1:  # Few first-stage candidates, or a crowded small KB.
        chosen += _draw_negatives(world, (), row, set(positives) | set(chosen), 0,
                                  size - 1 - len(chosen), rng)
      if len(chosen) < size - 1:
        raise ValueError(f"train claim {cid}: only {len(chosen)} negatives for a group of "
                         f"{size} among {len(world.ids)} sentences")
      claim_rows.append(c)
      members.append([used.setdefault(row[d], len(used)) for d in [positive] + chosen])
  return Groups([claim for _, claim, _ in world.train],
                np.asarray([int(cid) for cid, _, _ in world.train], np.int32),
                [world.texts[i] for i in used], np.asarray(claim_rows, np.int32),
                np.asarray(members, np.int32).reshape(-1, size))


_local = threading.local()


def _thread_tokenizer(path: str):
  """One tokenizer per thread: a fast tokenizer's truncation/padding state is per call."""
  cache = _local.__dict__.setdefault("tokenizers", {})
  if path not in cache:
    cache[path] = load_tokenizer(path)
  return cache[path]


def _tokenized_pairs(tokenizer_path: str, claims: list[str], sentences: list[str],
                    max_len: int) -> dict[str, np.ndarray]:
  enc = _thread_tokenizer(tokenizer_path)(
      claims, sentences, max_length=max_len, truncation=True, padding="max_length",
      return_token_type_ids=True)
  return {k: np.asarray(enc[k], np.int32)
          for k in ("input_ids", "attention_mask", "token_type_ids")}


def pair_lengths(tokenizer_path: str, claims: Sequence[str], sentences: Sequence[str],
                 max_len: int) -> np.ndarray:
  """Tokens of each (claim, sentence) pair as the model reads it (truncated to max_len)."""
  ids = _thread_tokenizer(tokenizer_path)(list(claims), list(sentences), max_length=max_len,
                                          truncation=True)["input_ids"]
  return np.fromiter(map(len, ids), np.int64, len(ids))


@dataclasses.dataclass(frozen=True)
class BatchWidth:
  """The token width of a global batch: the next multiple of `multiple` of its longest
  example, from lengths counted up front, so every process pads its rows alike without
  tokenising the others'."""
  lengths: np.ndarray  # [examples] tokens (a group: its longest pair).
  multiple: int
  max_len: int

  def __call__(self, indices: np.ndarray) -> int:
    return length_groups.padded_length(self.lengths[indices].max(), self.multiple,
                                       self.max_len)


class _BatchMap:
  """grain map: a global batch of example indices -> this process's tokenised rows."""

  def __init__(self, tokenizer_path: str, max_len: int, first: int, size: int,
               width: BatchWidth | None):
    self.tokenizer_path, self.max_len = tokenizer_path, max_len
    self.first, self.size, self.width = first, size, width

  def __call__(self, indices: np.ndarray) -> dict[str, np.ndarray]:
    indices = np.asarray(indices)
    out = self.rows(indices[self.first:self.first + self.size])
    if self.width is not None:
      width = self.width(indices)
      for name in ("input_ids", "attention_mask", "token_type_ids"):
        out[name] = out[name][..., :width]
    return out

  def rows(self, picked: np.ndarray) -> dict[str, np.ndarray]:
    raise NotImplementedError


def _pair_texts(pairs: Pairs, picked: np.ndarray) -> tuple[list[str], list[str]]:
  """(claims, sentences) of the picked pairs, as the cross-encoder reads them."""
  rows = pairs.pairs[picked]
  return [pairs.claims[c] for c in rows[:, 0]], [pairs.sentences[s] for s in rows[:, 1]]


def _group_texts(groups: Groups, picked: np.ndarray) -> tuple[list[str], list[str]]:
  """(claims, sentences) of every member of the picked groups, group by group."""
  width = groups.members.shape[1]
  return ([groups.claims[c] for c in groups.claim_rows[picked] for _ in range(width)],
          [groups.sentences[s] for s in groups.members[picked].reshape(-1)])


class PairBatch(_BatchMap):
  """Rows of pairs: [local batch, max_len] token fields, labels and claim ids."""

  def __init__(self, pairs: Pairs, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.pairs = pairs

  def rows(self, picked: np.ndarray) -> dict[str, np.ndarray]:
    rows = self.pairs.pairs[picked]
    out = _tokenized_pairs(self.tokenizer_path, *_pair_texts(self.pairs, picked), self.max_len)
    out.update(label=rows[:, 2].astype(np.float32), claim_id=self.pairs.claim_ids[rows[:, 0]])
    return out


class GroupBatch(_BatchMap):
  """Rows of groups: [local batch, group size, max_len] token fields and claim ids."""

  def __init__(self, groups: Groups, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.groups = groups

  def rows(self, picked: np.ndarray) -> dict[str, np.ndarray]:
    width = self.groups.members.shape[1]
    out = _tokenized_pairs(self.tokenizer_path, *_group_texts(self.groups, picked),
                           self.max_len)
    out = {k: v.reshape(len(picked), width, -1) for k, v in out.items()}
    out["claim_id"] = self.groups.claim_ids[self.groups.claim_rows[picked]]
    return out


@dataclasses.dataclass(frozen=True)
class Batching:
  """How training batches are cut and padded (all processes alike)."""
  global_batch: int
  local_batch: int
  seed: int
  length_multiple: int = 0  # Pad each batch to the next multiple of its longest; 0: max_len.
  length_groups: int = 0  # Examples of similar length together (data/length_groups.py).
  workers: int = 0
  read_ahead: pipelines.ReadAhead = pipelines.ReadAhead()


def _example_dataset(lengths: Callable[[], np.ndarray], count: int, make_map, max_len: int,
                     batching: Batching) -> grain.IterDataset:
  """Shuffled example indices, repeated forever, batched (grouped by length when asked) and
  mapped by `make_map(first, size, width)`; its iterator state checkpoints. Every process
  batches the same global stream and tokenises its own rows, so the global batches do not
  depend on the number of processes. `lengths()` is called only when a length is used."""
  b = batching
  counted = lengths() if b.length_multiple or b.length_groups else None
  width = BatchWidth(counted, b.length_multiple, max_len) if b.length_multiple else None
  if b.length_groups:
    ds = length_groups.index_batches(counted, b.global_batch, b.length_groups, b.seed)
  else:
    ds = (grain.MapDataset.range(count).seed(b.seed).shuffle().repeat(None)
          .batch(b.global_batch, drop_remainder=True))
  ds = ds.map(make_map(jax.process_index() * b.local_batch, b.local_batch, width))
  out = pipelines.iterate(ds, b.read_ahead)
  if b.workers > 0:
    if not flags.FLAGS.is_parsed():  # grain's workers read absl flags (see pipelines.py).
      flags.FLAGS.mark_as_parsed()
    out = out.mp_prefetch(grain.MultiprocessingOptions(num_workers=b.workers))
  return out


def pair_dataset(pairs: Pairs, tokenizer_path: str, max_len: int, batching: Batching
                 ) -> grain.IterDataset:
  every = np.arange(len(pairs.pairs))
  lengths = lambda: pair_lengths(  # noqa: E731
      tokenizer_path, *_pair_texts(pairs, every), max_len)
  return _example_dataset(
      lengths, len(every),
      lambda first, size, width: PairBatch(pairs, tokenizer_path, max_len, first, size, width),
      max_len, batching)


def group_dataset(groups: Groups, tokenizer_path: str, max_len: int, batching: Batching
                  ) -> grain.IterDataset:
  members = groups.members

  def lengths() -> np.ndarray:  # A group's length: its longest pair's.
    each = pair_lengths(tokenizer_path, *_group_texts(groups, np.arange(len(members))),
                        max_len)
    return each.reshape(members.shape).max(axis=1)

  return _example_dataset(
      lengths, len(members),
      lambda first, size, width: GroupBatch(groups, tokenizer_path, max_len, first, size,
                                            width),
      max_len, batching)


# ---- inference ---------------------------------------------------------------------------
@functools.lru_cache(maxsize=16)
def _forward(graphdef: nnx.GraphDef):

  @jax.jit
  def forward(state, ids, mask, types):
    return nnx.merge(graphdef, state)(ids, mask, types)

  return forward


def score_pairs(model: bert.CrossEncoder, tokenizer, queries: Sequence[str],
                texts: Sequence[str], *, max_len: int = 256, batch_size: int = 128,
                chunk_batches: int = 16, progress: bool = False) -> np.ndarray:
  """Relevance logits [N] (float32) of (queries[i], texts[i]), in input order.

  Pairs are tokenised a chunk at a time, sorted by length and padded to bucketed shapes
  (a few compiled programs whatever the data); a chunk's batches are all dispatched before
  the previous chunk's results are read, so tokenising overlaps computing. `progress`:
  print the pairs scored, with rate and ETA, to stderr.
  """
  if len(queries) != len(texts):
    raise ValueError(f"{len(queries)} queries but {len(texts)} texts")
  positions = model.config.max_position_embeddings
  if not 3 <= max_len <= positions:
    raise ValueError(f"max_len {max_len} must be in [3, {positions}] (max positions)")
  graphdef, state = nnx.split(model)
  forward = _forward(graphdef)
  lengths_b, sizes_b = encoding.length_buckets(max_len), encoding.batch_buckets(batch_size)
  bucket = lambda n, bs: next(b for b in bs if b >= n)  # noqa: E731
  pad = tokenizer.pad_token_id or 0
  out = np.zeros(len(queries), np.float32)
  chunk, pending = batch_size * chunk_batches, []
  bar = Progress("reranking", total=len(queries), unit="pairs", enabled=progress)
  for start in range(0, len(queries) + chunk, chunk):
    dispatched = []
    if start < len(queries):
      enc = tokenizer(list(queries[start:start + chunk]), list(texts[start:start + chunk]),
                      max_length=max_len, truncation=True, padding=False,
                      return_token_type_ids=True, return_attention_mask=False)
      ids, types = enc["input_ids"], enc["token_type_ids"]
      lengths = np.fromiter(map(len, ids), np.int64, len(ids))
      order = np.argsort(-lengths, kind="stable")
      for b in range(0, len(order), batch_size):
        rows = order[b:b + batch_size]
        shape = (bucket(len(rows), sizes_b), bucket(int(lengths[rows[0]]), lengths_b))
        batch, kinds, mask = (np.full(shape, pad, np.int32), np.zeros(shape, np.int32),
                              np.zeros(shape, np.int32))
        for j, r in enumerate(rows):
          batch[j, :lengths[r]], kinds[j, :lengths[r]], mask[j, :lengths[r]] = (
              ids[r], types[r], 1)
        dispatched.append((rows + start, forward(state, batch, mask, kinds)))
    for rows, result in pending:
      out[rows] = distributed.to_host(result)[:len(rows)]
      bar.update(len(rows))
    pending = dispatched
  bar.close()
  return out


def rerank(model: bert.CrossEncoder, tokenizer, claims: Sequence[str],
           candidates: Sequence[Sequence[tuple[str, str]]], *, top_k: int | None = None,
           max_len: int = 256, batch_size: int = 128, progress: bool = False
           ) -> list[Ranked]:
  """Reorders each claim's candidates by the cross-encoder's logit.

  Args:
    claims: the query texts.
    candidates: per claim, (document id, document text) pairs (e.g. a bi-encoder's top-1000).
    top_k: keep this many per claim (None: all).
    progress: print the pairs scored, with rate and ETA (score_pairs).

  Returns:
    Per claim, [(document id, logit)] best first; equal logits keep the input order.
  """
  if len(claims) != len(candidates):
    raise ValueError(f"{len(claims)} claims but {len(candidates)} candidate lists")
  queries = [claim for claim, cands in zip(claims, candidates) for _ in cands]
  texts = [text for cands in candidates for _, text in cands]
  scores = score_pairs(model, tokenizer, queries, texts, max_len=max_len,
                       batch_size=batch_size, progress=progress)
  out, start = [], 0
  for cands in candidates:
    part = scores[start:start + len(cands)]
    order = np.argsort(-part, kind="stable")[:top_k]
    out.append([(cands[i][0], float(part[i])) for i in order])
    start += len(cands)
  return out


@dataclasses.dataclass
class Reranker:
  """A trained reranker with its tokenizer: `reranker(claims, candidates, top_k)`."""
  model: bert.CrossEncoder
  tokenizer: Any
  max_len: int
  step: int

  def __call__(self, claims: Sequence[str], candidates: Sequence[Sequence[tuple[str, str]]],
               top_k: int | None = None, batch_size: int = 128, progress: bool = False
               ) -> list[Ranked]:
    return rerank(self.model, self.tokenizer, claims, candidates, top_k=top_k,
                  max_len=self.max_len, batch_size=batch_size, progress=progress)

  def rerank_run(self, claims: Sequence[str], run: Mapping[str, Ranked],
                 texts: Mapping[str, str], top_k: int | None = None) -> dict[str, Ranked]:
    """A first-stage run (claim key -> [(id, score)], keys in `claims`' order) reranked;
    `texts` maps document ids to their text."""
    keys = list(run)
    if len(keys) != len(claims):
      raise ValueError(f"{len(claims)} claims but the run has {len(keys)} queries")
    missing = next((d for k in keys for d, _ in run[k] if d not in texts), None)
    if missing is not None:
      raise MochegInputError(f"the run names document {missing!r}, which has no text")
    ranked = self(claims, [[(d, texts[d]) for d, _ in run[k]] for k in keys], top_k)
    return dict(zip(keys, ranked))


def load_reranker(workdir: str, which: str = "best", moved: tuple[str, str] | None = None
                  ) -> Reranker:
  """The reranker of a training workdir (no mining: that happens only when training);
  `moved`: the workdir's folder was copied from elsewhere (see restore.load_trained)."""
  from mocheg_jax.train.restore import load_trained
  trained = load_trained(workdir, which, moved)
  if not isinstance(trained.model, bert.CrossEncoder):
    raise MochegInputError(f"{workdir}: not a reranker's workdir (task "
                           f"{trained.config.task!r})")
  data = prepared_data(trained.config, workdir, log=lambda _: None)
  tokenizer = load_tokenizer(tokenizer_dir(trained.config.model, data.wordpiece))
  return Reranker(trained.model, tokenizer, trained.config.rerank.max_len, trained.step)


# ---- dev figures ---------------------------------------------------------------------------
def candidate_auc(qrels: Mapping[str, Mapping[str, int]], run: Mapping[str, Ranked]) -> float:
  """Mean over claims of P(a relevant candidate outscores an irrelevant one), ties half.

  A whole-list measure: it sees a reordering anywhere in the candidates, where recall@5
  sees only the head. Claims whose candidates are all relevant or all not are left out.
  """
  values = []
  for cid, ranked in run.items():
    gold = {d for d, rel in qrels.get(cid, {}).items() if rel > 0}
    labels = np.asarray([d in gold for d, _ in ranked], bool)
    if labels.all() or not labels.any():
      continue
    scores = np.asarray([s for _, s in ranked], np.float64)
    pos, neg = scores[labels][:, None], scores[~labels][None, :]
    values.append(float(np.mean((pos > neg) + 0.5 * (pos == neg))))
  return float(np.mean(values)) if values else float("nan")


def candidate_scores(qrels: Mapping[str, Mapping[str, int]],
                     run: Mapping[str, Ranked]) -> dict[str, float]:
  """The dev figures of one ordering of the candidates: recall/NDCG@5,10, MRR@10, the
  un-cut TREC ndcg and map over the candidate list, and `candidate_auc`."""
  out = evaluation.score(qrels, run)
  full = retrieval_metrics.evaluate_run(qrels, run, ks=evaluation.EVAL_KS)
  out.update(ndcg=full["ndcg"], map=full["map"], auc=candidate_auc(qrels, run))
  return out


# ---- the task -------------------------------------------------------------------------------
def make_task(config: ml_collections.ConfigDict, workdir: str) -> Task:
  data = prepared_data(config, workdir)
  source = cross_source(config.model, data.wordpiece)
  r = config.rerank
  if not 3 <= r.max_len <= source.config.max_position_embeddings:
    raise ValueError(f"config.rerank.max_len {r.max_len} must be in [3, "
                     f"{source.config.max_position_embeddings}] (the model's max positions)")
  if r.length_multiple < 0:
    raise ValueError(f"config.rerank.length_multiple must be >= 0 (0: pad to max_len), got "
                     f"{r.length_multiple}")
  if r.loss not in LOSSES:
    raise ValueError(f"config.rerank.loss {r.loss!r}: expected one of {LOSSES}")
  listwise = r.loss == "listwise"
  dtype = jnp.dtype(config.model.dtype)
  log = print if distributed.is_primary() else (lambda _: None)

  # Loading the KB, mining and pairing happen on first use (training or evaluation), so
  # `load_trained` of this workdir for inference does none of them.
  @functools.cache
  def world() -> World:
    w = load_world(data.release, r.max_corpus, config.seed)
    if w.skipped:
      log(f"rerank: {w.skipped} train claims have no relevant sentence in the KB (skipped)")
    return w

  @functools.cache
  def mined() -> dict[str, Any]:
    return mining.cached_mining(os.path.join(workdir, mining.MINED_FILE),
                                mining_settings(config),
                                lambda: mine(r, world(), config.seed, log), log)

  @functools.cache
  def pairs() -> Pairs:
    p = training_pairs(world(), mined()["train"], r.hard_negatives, r.random_negatives,
                       config.seed)
    positives = int(p.pairs[:, 2].sum())
    log(f"rerank: {len(p.pairs)} training pairs ({positives} positive) over "
        f"{len(p.claims)} claims; auto pos_weight {p.pos_weight:.3f}")
    return p

  @functools.cache
  def groups() -> Groups:
    g = training_groups(world(), mined()["train"], r.hard_negatives, r.random_negatives,
                        config.seed)
    log(f"rerank: {len(g.members)} training groups of {g.members.shape[1]} over "
        f"{len(g.claims)} claims")
    return g

  def model() -> bert.CrossEncoder:
    return bert.CrossEncoder(source.config, dtype=dtype, rngs=nnx.Rngs(config.seed))

  def pair_loss(model: bert.CrossEncoder, batch: dict[str, Any]):
    weight = r.pos_weight if r.pos_weight > 0 else pairs().pos_weight
    logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                   deterministic=False)
    value = bce_with_logits(logits, batch["label"], weight)
    accuracy = jnp.mean((logits > 0) == (batch["label"] > 0.5))
    return value, {"batch_accuracy": accuracy, "mean_positive_logit": jnp.sum(
        logits * batch["label"]) / jnp.maximum(jnp.sum(batch["label"]), 1.0)}

  def group_loss(model: bert.CrossEncoder, batch: dict[str, Any]):
    shape = batch["input_ids"].shape  # [groups, group size, length]
    flat = lambda x: x.reshape(-1, shape[-1])  # noqa: E731
    logits = model(flat(batch["input_ids"]), flat(batch["attention_mask"]),
                   flat(batch["token_type_ids"]), deterministic=False).reshape(shape[:2])
    # batch_accuracy: how often the relevant sentence tops its group.
    return listwise_cross_entropy(logits), {
        "batch_accuracy": jnp.mean(jnp.argmax(logits, axis=-1) == 0),
        "mean_positive_logit": jnp.mean(logits[:, 0]),
        "mean_negative_logit": jnp.mean(logits[:, 1:])}

  def train_data(local_batch: int):
    make, examples = (group_dataset, groups()) if listwise else (pair_dataset, pairs())
    batching = Batching(config.batch_size, local_batch, config.seed, r.length_multiple,
                        config.data.get("length_groups", 0), config.data.workers,
                        pipelines.ReadAhead.of(config.data))
    return iter(make(examples, source.tokenizer_dir, r.max_len, batching))

  tokenizer = load_tokenizer(source.tokenizer_dir)

  @functools.cache
  def dev_set() -> tuple[list[str], dict[str, Ranked], list[list[tuple[str, str]]],
                         dict[str, float]]:
    """Dev claims, first-stage runs, candidates with texts, and the "before" figures."""
    w, dev = world(), mined()["dev"]
    text = dict(zip(w.ids, w.texts))
    first_stage = {cid: [(d, s) for d, s in dev[cid]] for cid, _ in w.dev}
    candidates = [[(d, text[d]) for d, _ in first_stage[cid]] for cid, _ in w.dev]
    before = {f"before_{k}": v for k, v in candidate_scores(w.dev_qrels, first_stage).items()}
    before["candidates_recall"] = retrieval_metrics.evaluate_run(
        w.dev_qrels, first_stage, ks=(r.eval_candidates,))[f"R@{r.eval_candidates}"]
    return [claim for _, claim in w.dev], first_stage, candidates, before

  def evaluate(model: bert.CrossEncoder, step: int):
    del step
    claims, first_stage, candidates, before = dev_set()
    ranked = rerank(model, tokenizer, claims, candidates, max_len=r.max_len,
                    batch_size=r.eval_batch_size)
    yield from candidate_scores(world().dev_qrels, dict(zip(first_stage, ranked))).items()
    yield from before.items()

  tokens = ("batch", None, "length") if listwise else ("batch", "length")
  batch_axes = {"input_ids": tokens, "attention_mask": tokens, "token_type_ids": tokens,
                "claim_id": ("batch",)}
  if not listwise:
    batch_axes["label"] = ("batch",)
  return Task(model=model, loss=group_loss if listwise else pair_loss, batch_axes=batch_axes,
              train_data=train_data, evaluators=(Evaluator("dev", evaluate),),
              initial_params=source.weights)
