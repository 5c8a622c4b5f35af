"""The main job on the embedded default, the synthetic Mocheg world.

  python scripts/run_pipeline.py --scale=tiny --workdir=runs/tiny

Builds the world, prints its statistics in the release table's rows, trains the local
tokenizers, builds the TFDS dataset and draws one batch from every task pipeline. Rerunning
with the same workdir reuses every finished step.
"""

from absl import app, flags

from mocheg_jax import workflow
from mocheg_jax.utils.cli import friendly_errors

_SCALE = flags.DEFINE_enum("scale", "tiny", ["tiny", "small", "paper"], "World size.")
_WORKDIR = flags.DEFINE_string("workdir", "runs/tiny", "Where every output goes.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the synthetic world and the pipelines.")


@friendly_errors
def main(argv):
  del argv
  workflow.run(_SCALE.value, _WORKDIR.value, seed=_SEED.value)


if __name__ == "__main__":
  app.run(main)
