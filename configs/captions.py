"""Caption pre-training of the small CLIP (the synthetic worlds' stand-in for web pre-training).

  python scripts/train.py --config=configs/captions.py:tiny --workdir=runs/captions

Trains the image retriever's random CLIP on rendered pictures and captions naming what they
show (mocheg_jax/retrieval/caption_task.py); the image retriever then starts from it with
--config.model.init=runs/captions (the main job does this on the synthetic worlds). The
model shape must be the image retriever's: pass the same --config.model.* overrides.

Variants:
  tiny:  a 1,000-pair corpus, 40 steps; seconds on a CPU, a plumbing check (the value
         accuracy stays near chance).
  small: the small image retriever's CLIP (patch 8), 20,000 pairs, 2,000 steps of 128:
         about 7 minutes on 2 CPU cores (plus ~40 s drawing the corpus once). Measured:
         held-out value accuracy 0.96 (chance 0.25; colours and counts ~1.0, shapes ~0.84).
  paper: as small; only used when a paper-scale image retriever is given no pretrained
         CLIP (--config.model.init=random), which the paper's runs never do.
"""

from mocheg_jax.retrieval import caption_task
from mocheg_jax.retrieval import image_task
from mocheg_jax.train import config as config_lib


def get_config(variant: str = "tiny"):
  c = config_lib.base_config()
  c.task = "mocheg_jax.retrieval.caption_task:make_task"
  c.model = image_task.model_config()
  c.retrieval = image_task.retrieval_config()
  c.retrieval.symmetric = True  # Both directions, as CLIP's own pre-training.
  c.captions = caption_task.captions_config()
  c.best_metric = "dev/value_accuracy"
  c.optimizer.name = "adamw"
  c.optimizer.schedule = "cosine"
  c.optimizer.learning_rate = 1e-3
  c.optimizer.weight_decay = 0.1
  c.retrieval.max_query_len = 32  # Captions are short.
  if variant == "tiny":
    c.total_steps = 40
    c.batch_size = 32
    c.log_every = 20
    c.eval_every = 0  # Once, at the end.
    c.checkpoint_every = 40
    c.optimizer.warmup_steps = 10
    c.captions.pairs = 1000
    c.captions.eval_pairs = 32
  elif variant in ("small", "paper"):
    c.data.scale = variant
    c.model.patch_size = 8  # The small image retriever's (configs/retrieval_image.py).
    c.total_steps = 2000
    c.batch_size = 128
    c.log_every = 100
    c.eval_every = 500
    c.checkpoint_every = 500
    c.optimizer.warmup_steps = 50
  else:
    raise ValueError(f"unknown variant {variant!r}: expected tiny, small or paper")
  return c
