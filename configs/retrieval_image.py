"""Image evidence retriever: CLIP, claim text -> KB image, InfoNCE with in-batch negatives.

  python scripts/train.py --config=configs/retrieval_image.py:tiny --workdir=runs/image

Variants:
  tiny:  a small random CLIP (2+2 layers, 64-d, 64px images, patch 16) on the tiny world;
         about 2 minutes on a busy 2-core CPU. It learns its 46 training claims; dev recall
         stays at chance (too few claims to generalise): a plumbing check.
  small: the same CLIP with patch 8 on the small world, 600 steps of 64: about 10-14
         minutes on a busy 2-core CPU; dev R@10 about 5x chance, median rank of the gold
         images about 1/10 of the KB (most gold images are signs to be read, beyond a
         random CLIP; see image_task.py).
  paper: the reference's settings: CLIP ViT-B/32 from a local HF folder
         (--config.model.init=PATH/clip-vit-base-patch32, its tokenizer in the same folder),
         claims <= 77 tokens, batch 480, AdamW lr 1e-7 (the reference's default), weight
         decay 0.001, 50 warmup steps, linear decay, clip 1, cosine x 20 query -> image
         only, embeddings and block 0 of both towers frozen (the reference's
         freeze_part_bert(17, 20)); about 20 epochs of the real release's training claims.
         Pass the release with --config.data.release=DIR.
Options of every variant: --config.retrieval.learnable_scale=True (CLIP's logit_scale),
--config.retrieval.symmetric=True (add image -> text), --config.model.freeze_text_layers=N,
--config.model.freeze_vision_layers=N (mocheg_jax/retrieval/image_task.py explains them).
"""

from mocheg_jax.retrieval import image_task
from mocheg_jax.train import config as config_lib


def get_config(variant: str = "tiny"):
  c = config_lib.base_config()
  c.task = "mocheg_jax.retrieval.image_task:make_task"
  c.model = image_task.model_config()
  c.retrieval = image_task.retrieval_config()
  c.best_metric = "dev/recall@5"
  c.optimizer.name = "adamw"
  c.optimizer.schedule = "linear"
  c.optimizer.clip_norm = 1.0
  c.optimizer.weight_decay = 0.001
  if variant == "tiny":
    c.total_steps = 120
    c.batch_size = 32
    c.log_every = 20
    c.eval_every = 60
    c.checkpoint_every = 60
    c.optimizer.learning_rate = 1e-3
    c.optimizer.warmup_steps = 20
    c.optimizer.weight_decay = 0.1  # A random CLIP, as CLIP's own training (0.2).
    c.retrieval.max_query_len = 64
  elif variant == "small":
    c.data.scale = "small"
    c.total_steps = 600
    c.batch_size = 64
    c.log_every = 50
    c.eval_every = 0  # Dev search over all 10k kept KB images: once, at the end.
    c.checkpoint_every = 300
    c.optimizer.learning_rate = 1e-3
    c.optimizer.warmup_steps = 50
    c.optimizer.weight_decay = 0.1
    c.model.patch_size = 8  # 64 patches: counts and shapes need the finer grid.
    c.retrieval.max_query_len = 64
  elif variant == "paper":
    c.data.scale = "paper"
    c.data.workers = 8  # Decoding 480 images a step needs worker processes.
    c.model.init = ""  # Required: a local HF CLIP ViT-B/32 folder.
    c.model.freeze_text_layers = 1
    c.model.freeze_vision_layers = 1
    c.total_steps = 300
    c.batch_size = 480
    c.log_every = 10
    c.eval_every = 100
    c.checkpoint_every = 100
    c.optimizer.learning_rate = 1e-7
    c.optimizer.warmup_steps = 50
    c.retrieval.max_query_len = 77
    c.retrieval.eval_batch_size = 256
  else:
    raise ValueError(f"unknown variant {variant!r}: expected tiny, small or paper")
  return c
