"""The main job: every stage trained and scored, then a pipeline folder and its report.

  python scripts/run_pipeline.py --scale=tiny --workdir=runs/tiny
  python scripts/run_pipeline.py --scale=paper --workdir=runs/paper --release=/data/mocheg \
      --clip=/models/clip-vit-base-patch32 --bert=/models/bert-base-uncased \
      --bart=/models/bart-large [--override=verify:total_steps=5000 ...]

Without --release it writes the synthetic world of --scale into WORKDIR/release; with it,
the stages train on that Mocheg release with configs/*.py:SCALE. Rerunning with the same
workdir reuses every finished step (see mocheg_jax/workflow.py for the steps).
"""

if __name__ == "__main__":  # First: a re-exec keeps nothing done before it.
  from mocheg_jax.utils import allocator
  # One process trains and scores every stage: pages a stage freed and nothing reused for
  # 10 s go back to the kernel. With none handed back (-1, every other script's setting) the
  # small job reached 24 GB of resident memory by its rewarded generator and was killed on
  # a 24 GB machine (2026-12-07); the tiny job peaked at 2.69 GB instead of 3.39.
  allocator.run_under_preferred_allocator(purge_delay_ms=10_000)

import ast

import jax
from absl import app, flags

from mocheg_jax import workflow
from mocheg_jax.models import matmul
from mocheg_jax.parallel import distributed
from mocheg_jax.utils import compile_cache
from mocheg_jax.utils.cli import friendly_errors

_SCALE = flags.DEFINE_enum("scale", "tiny", ["tiny", "small", "paper"],
                           "Config variant of every stage (and the synthetic world's size).")
_WORKDIR = flags.DEFINE_string("workdir", "runs/tiny", "Where every output goes.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the synthetic world and the pipelines.")
_RELEASE = flags.DEFINE_string("release", "", "A Mocheg release folder to run on instead of "
                               "the synthetic world.")
flags.DEFINE_string("clip", "", "Local HF CLIP folder the image retriever starts "
                            "from (required by --scale=paper).")
flags.DEFINE_string("bert", "", "Local HF BERT folder of the truthfulness "
                            "classifier (required by --scale=paper).")
flags.DEFINE_string("bart", "", "Local HF BART folder of the generator (required by "
                            "--scale=paper).")
_DISTRIBUTED = flags.DEFINE_enum(
    "distributed", "auto", list(distributed.MODES),
    "Start jax.distributed: auto (when the environment is a multi-process job: Cloud TPU "
    "pod, SLURM, Open MPI, JAX_COORDINATOR_ADDRESS, or the flags below are given), on, off.")
_COORDINATOR = flags.DEFINE_string("coordinator", "", "host:port of process 0's "
                                   "coordinator (multi-process runs outside a scheduler).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 0, "Processes in the job (0: detect).")
_PROCESS_ID = flags.DEFINE_integer("process_id", -1, "This process's index (-1: detect).")
_HEARTBEAT = flags.DEFINE_integer(
    "heartbeat_timeout_s", 0, "Seconds without a heartbeat before the coordinator declares "
    "a process dead and stops the job (0: JAX's default, 100 s).")
_MATMUL_PRECISION = flags.DEFINE_enum(
    "matmul_precision", "auto", ["auto", "bfloat16", "float32"], "Products of float32 "
    "arrays: bfloat16 operands with float32 sums (~4x faster dense layers on CPUs with AMX, "
    "up to ~1.8x with AVX-512 BF16; mocheg_jax/models/matmul.py) or float32 throughout. "
    "auto: JAX's setting where one is given ($JAX_DEFAULT_MATMUL_PRECISION), else bfloat16 "
    "where every process of the job runs on a CPU with AMX or AVX-512 BF16 and the "
    "backend's default elsewhere (float32 on other CPUs). "
    "A stage's config may keep its own "
    "(config.matmul_precision; the small reranker trains in float32). The pipeline folder "
    "records the job's setting for scripts/fact_check.py.")
_COMPILATION_CACHE = flags.DEFINE_boolean(
    "compilation_cache", True, "Keep compiled programs in WORKDIR/compilation_cache (one "
    "folder per host CPU) and read back the ones met again, in this run or a rerun "
    "(mocheg_jax/utils/compile_cache.py). $JAX_COMPILATION_CACHE_DIR, when set, is used "
    "instead.")
_OVERRIDE = flags.DEFINE_multi_string(
    "override", [], "CONFIG:dotted.key=value, set in configs/CONFIG.py:SCALE for the stage "
    "that uses it (value: a Python literal, else a string); repeatable.")


def parse_override(text: str) -> tuple[str, str, object]:
  """"verify:total_steps=5000" -> ("verify", "total_steps", 5000)."""
  name, _, assignment = text.partition(":")
  key, equals, value = assignment.partition("=")
  if not (name and key and equals):
    raise app.UsageError(f"--override={text!r}: expected CONFIG:dotted.key=value")
  try:
    parsed = ast.literal_eval(value)
  except (ValueError, SyntaxError):
    parsed = value  # A plain string such as a folder path.
  return name, key, parsed


@friendly_errors
def main(argv):
  del argv
  # Before anything compiles: JAX settles on its cache folder at the first compilation.
  if _COMPILATION_CACHE.value:
    compile_cache.use_workdir_cache(_WORKDIR.value)
  compiles = compile_cache.CompileTally()
  # Before anything touches the devices. Every process runs this same command; the
  # stages then train together and process 0 writes the shared outputs.
  distributed.maybe_initialize(_DISTRIBUTED.value, _COORDINATOR.value, _NUM_PROCESSES.value,
                               _PROCESS_ID.value, _HEARTBEAT.value)
  precision = _MATMUL_PRECISION.value
  if precision == "auto":
    precision = "" if jax.config.jax_default_matmul_precision else matmul.auto_precision()
    # The processes compute the same products together: bfloat16 only if every one of them
    # picks it (a job across machines with and without bfloat16 units stays at JAX's
    # default).
    if not distributed.on_every_process(precision == "bfloat16"):
      precision = ""
  if precision:
    jax.config.update("jax_default_matmul_precision", precision)
  overrides: dict[str, dict] = {}
  for (name, key), flag in workflow.PAPER_REQUIRED.items():  # --clip, --bert, --bart.
    folder = flags.FLAGS[flag.lstrip("-")].value
    if folder:
      overrides.setdefault(name, {})[key] = folder
  for text in _OVERRIDE.value:
    name, key, value = parse_override(text)
    overrides.setdefault(name, {})[key] = value
  workflow.run(_SCALE.value, _WORKDIR.value, seed=_SEED.value, release=_RELEASE.value,
               overrides=overrides)
  print(compiles.summary())


if __name__ == "__main__":
  app.run(main)
