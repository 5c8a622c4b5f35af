"""The tiny main job cut to a few training steps, as the tests share it.

Every stage trains STEPS steps (the trainings are what the default tiny configs spend their
minutes on; the tests check plumbing, tables and agreement, not learning). One run of it,
`scripts/run_pipeline.py` in a subprocess with 2 fake CPU devices, is shared by the
workflow tests (tests/test_workflow.py) and is the reference the 2-process run is compared
with (tests/test_pipeline_multiprocess.py): the `tiny_main_job` fixture in conftest.py.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from tests.processes import Runs, environment

STEPS = 4
TIMEOUT_S = 1800  # A few minutes on an idle 2-core machine (compiling dominates).
_CONFIGS = ("retrieval_text", "rerank", "retrieval_image", "verify", "classifier", "explain")
OVERRIDES = {name: {"total_steps": STEPS, "checkpoint_every": STEPS,
                    "optimizer.warmup_steps": 1} for name in _CONFIGS}
OVERRIDES["explain"]["explain.sc_start_step"] = 2  # The reward term runs too.


def override_flags() -> list[str]:
  """OVERRIDES as scripts/run_pipeline.py's --override flags."""
  return [f"--override={name}:{key}={value}"
          for name, keys in OVERRIDES.items() for key, value in keys.items()]


@dataclasses.dataclass(frozen=True)
class TinyJob:
  workdir: Path
  summary: dict  # summary.json
  log: str  # What the job printed.
  cache_dir: Path  # The persistent compilation cache it filled (other runs may share it).


def run(root: Path) -> TinyJob:
  """Runs the cut tiny main job into root/workdir with one process and 2 CPU devices."""
  workdir, cache_dir, logs = root / "workdir", root / "jax_cache", root / "logs"
  logs.mkdir(parents=True)
  runs = Runs(logs, TIMEOUT_S)
  try:
    runs.start("tiny_main_job", "scripts/run_pipeline.py",
               ["--scale=tiny", *override_flags(), f"--workdir={workdir}",
                "--distributed=off"], environment(2, cache_dir))
    log = runs.wait()["tiny_main_job"]
  finally:
    runs.kill()
  return TinyJob(workdir, json.loads((workdir / "summary.json").read_text()), log, cache_dir)
