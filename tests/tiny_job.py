"""The tiny main job cut to a few training steps, as the tests share it.

Every stage trains STEPS steps (the trainings are what the default tiny configs spend their
minutes on; the tests check plumbing, tables and agreement, not learning). Two runs of it
are shared by the session (conftest.py):
- `scripts/run_pipeline.py` in one process with 2 fake CPU devices: the `tiny_main_job`
  fixture, used by the workflow tests (tests/test_workflow.py) and the reference the
  2-process run is compared with;
- the same job as 2 JAX processes x 1 device (jax.distributed on localhost): the
  `two_process_job` fixture (tests/test_pipeline_multiprocess.py).
Both start in the background at the session's first test when a collected test needs them
(`start_one_process`, `start_two_processes`), niced, and the tests on them run last: they
fill the CPU time the other tests leave idle (measured: the session 32 -> 19-22 minutes on 2
cores) instead of holding it up for ~12 minutes.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from mocheg_jax.utils.host_devices import YNNPACK_OFF
from tests.processes import Runs, environment, free_port, process_flags

STEPS = 4
TIMEOUT_S = 1800  # A few minutes on an idle 2-core machine (compiling dominates).
NICENESS = 10  # Below the tests in the foreground: they wait on nothing of these runs.
_CONFIGS = ("retrieval_text", "rerank", "captions", "retrieval_image", "verify", "classifier",
            "explain")
OVERRIDES = {name: {"total_steps": STEPS, "checkpoint_every": STEPS,
                    "optimizer.warmup_steps": 1} for name in _CONFIGS}
OVERRIDES["explain"]["explain.sc_start_step"] = 2  # The reward term runs too.


# The job's products, pinned: its default ("auto") picks bfloat16 on CPUs with AMX, and the
# tests compare the job with runs in their own process, at JAX's default.
PRECISION = "float32"


def override_flags() -> list[str]:
  """OVERRIDES as scripts/run_pipeline.py's --override flags."""
  return [f"--override={name}:{key}={value}"
          for name, keys in OVERRIDES.items() for key, value in keys.items()]


@dataclasses.dataclass(frozen=True)
class TinyJob:
  workdir: Path
  summary: dict  # summary.json
  log: str  # What the job printed (process 0's, for the 2-process run).
  outputs: dict[str, str]  # Every process's stdout, by run name.


class Started:
  """A shared run going on in the background; `result()` waits for it (once)."""

  def __init__(self, runs: Runs, workdir: Path, main: str):
    self._runs, self._workdir, self._main = runs, workdir, main
    self._result: TinyJob | None = None

  def result(self) -> TinyJob:
    if self._result is None:
      try:
        outputs = self._runs.wait()
      finally:
        self._runs.kill()
      self._result = TinyJob(self._workdir,
                             json.loads((self._workdir / "summary.json").read_text()),
                             outputs[self._main], outputs)
    return self._result

  def kill(self) -> None:
    self._runs.kill()


def _runs(root: Path) -> Runs:
  logs = root / "logs"
  logs.mkdir(parents=True)
  return Runs(logs, TIMEOUT_S, niceness=NICENESS)


def job_environment(root: Path) -> dict[str, str]:
  """The environment of `start_one_process(root)`'s job: its devices, flags and cache."""
  return environment(2, root / "jax_cache")


def start_one_process(root: Path) -> Started:
  """Starts the cut tiny main job into root/workdir: one process, 2 CPU devices."""
  workdir, runs = root / "workdir", _runs(root)
  runs.start("tiny_main_job", "scripts/run_pipeline.py",
             ["--scale=tiny", *override_flags(), f"--matmul_precision={PRECISION}",
              f"--workdir={workdir}", "--distributed=off"],
             job_environment(root))
  return Started(runs, workdir, "tiny_main_job")


def start_two_processes(root: Path) -> Started:
  """Starts the cut tiny main job into root/workdir as 2 processes x 1 CPU device."""
  workdir, runs = root / "workdir", _runs(root)
  coordinator = f"localhost:{free_port()}"
  # The reference's 2 devices in one process run without YNNPACK's kernels (they must:
  # mocheg_jax/utils/host_devices.py); these do the same, so that both layouts add in the
  # same order (with YNNPACK here, 4 Adam steps left one word embedding 5.6e-6 apart).
  env = environment(1, root / "jax_cache")
  env["XLA_FLAGS"] += f" {YNNPACK_OFF}"
  for process in range(2):
    runs.start(f"process{process}", "scripts/run_pipeline.py",
               ["--scale=tiny", *override_flags(), f"--matmul_precision={PRECISION}",
                f"--workdir={workdir}", *process_flags(coordinator, 2, process, style="flags")],
               env)
  return Started(runs, workdir, "process0")
