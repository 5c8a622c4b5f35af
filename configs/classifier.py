"""The truthfulness classifier: the reward model of explanation generation (issue 7).

  python scripts/train.py --config=configs/classifier.py:tiny --workdir=runs/classifier \
      [--config.classifier.body=bert] [--config.classifier.init=PATH]

It learns a claim's label from its gold explanation; the explanation generator's REINFORCE
reward is p(gold) - the other classes' probabilities under it (frozen).

Variants:
  tiny:  a random 2-layer BART encoder (d_model 64) on the tiny world's BPE ids; a minute
         on a CPU.
  small: the small world; a random BART encoder sized like the small generator (2 layers,
         d_model 128) over the world's BPE tokenizer, so the generator's sampled ids are
         scored inside its jitted step. --config.classifier.body=bert
         --config.classifier.init=minilm trains the host-tokenised path on the packaged
         MiniLM instead.
  paper: the reference's settings (controllable/classification): bert-base-uncased from a
         local HF folder (--config.classifier.init=PATH/bert-base-uncased, required), its
         pooler output -> 128 -> 16 -> 3, max 512 tokens cut on the left, Adam lr 5e-5 with
         6,000 warmup steps and linear decay, batch 40, class weights with p = 2, the
         embeddings and the first layer frozen, an evaluation per epoch with early stopping
         after 10; model selection by dev macro F1 (the reference logs micro F1). Pass the
         release with --config.data.release=DIR.
"""

from mocheg_jax.explanation import classifier_task
from mocheg_jax.train import config as config_lib


def get_config(variant: str = "tiny"):
  c = config_lib.base_config()
  c.task = "mocheg_jax.explanation.classifier_task:make_task"
  c.classifier = classifier_task.classifier_config()
  c.best_metric = "dev/macro_f1"
  c.optimizer.name = "adam"
  if variant == "tiny":
    c.total_steps = 150
    c.batch_size = 16
    c.log_every = 25
    c.eval_every = 50
    c.checkpoint_every = 50
    c.optimizer.learning_rate = 1e-3
    c.optimizer.schedule = "constant"
    c.optimizer.warmup_steps = 10
    c.classifier.dropout = 0.0  # 75 training explanations; the head keeps its 0.3.
    c.classifier.max_len = 256
  elif variant == "small":
    c.data.scale = "small"
    c.total_steps = 300  # Dev macro F1 0.99 from step 100 on (1,122 explanations).
    c.batch_size = 32
    c.log_every = 50
    c.eval_every = 100
    c.checkpoint_every = 100
    c.early_stopping_patience = 3
    c.optimizer.learning_rate = 1e-3
    c.optimizer.warmup_steps = 30
    c.classifier.hidden_size = 128
    c.classifier.num_heads = 4
    c.classifier.mlp_size = 512
    c.classifier.max_len = 256
  elif variant == "paper":
    c.data.scale = "paper"
    c.classifier.body = "bert"
    c.classifier.init = ""  # Required: a local bert-base-uncased folder.
    c.classifier.max_len = 512
    c.total_steps = 29100  # 100 epochs of 11,669 / 40 claims, as the reference's limit.
    c.batch_size = 40
    c.log_every = 100
    c.eval_every = 291  # One epoch.
    c.checkpoint_every = 291
    c.early_stopping_patience = 10
    c.optimizer.learning_rate = 5e-5
    c.optimizer.warmup_steps = 6000
    # The reference freezes BERT's first 21 parameters: the embeddings and layer 0.
    c.freeze = r"^body\.(embeddings|encoder\.layers\.0)\."
  else:
    raise ValueError(f"unknown variant {variant!r}: expected tiny, small or paper")
  return c
