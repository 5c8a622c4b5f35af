"""The trainer across two processes (jax.distributed on CPU, gloo) against one process.

Two `scripts/train.py` processes with 2 fake CPU devices each (4 global devices, mesh
data=4) train the toy task, and one process with 4 fake devices trains the same config as
the reference, at the same time. They must log the same losses and evaluation and end with
the same parameters; the 2-process checkpoints must hold one input-position file per process.
Then the 2-process run loses its last checkpoint and is rerun: it must resume from the one
before (orbax restore across processes, each process's grain position) and end exactly
where the reference ended.

Every run is a subprocess with its own XLA_FLAGS (the pytest process already has 8 devices).
The runs share a persistent compilation cache, so the rerun does not compile its step again.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from flax import traverse_util

from mocheg_jax.train.checkpoint import Checkpointer
from mocheg_jax.train.loop import CHECKPOINT_DIR
from mocheg_jax.train.writer import read_metrics
from tests.processes import REPO, Runs, environment, free_port, process_flags

TIMEOUT_S = 240  # Per run; the whole test takes about a minute on an idle 2-core machine.
STEPS, CHECKPOINT_EVERY = 6, 3
RTOL = 1e-5

_COMMON_FLAGS = (f"--config={REPO / 'tests' / 'toy_task.py'}",
                 f"--config.total_steps={STEPS}",
                 f"--config.checkpoint_every={CHECKPOINT_EVERY}",
                 "--config.log_every=1",
                 "--config.mesh.data=-1")


def _start_two_processes(runs: Runs, workdir: Path, cache_dir: Path, tag: str) -> None:
  coordinator = f"localhost:{free_port()}"
  for process in range(2):
    runs.start(f"{tag}_process{process}", "scripts/train.py",
               [*_COMMON_FLAGS, f"--workdir={workdir}",
                *process_flags(coordinator, 2, process)],
               environment(2, cache_dir))


def _reported(stdout: str) -> list[dict]:
  """The JSON result lines scripts/train.py prints at the end."""
  return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def _losses(workdir: Path) -> dict[int, float]:
  records = [r for r in read_metrics(workdir) if "loss" in r]
  steps = [r["step"] for r in records]
  assert steps == list(range(1, STEPS + 1)), f"{workdir}: logged steps {steps}"
  return {r["step"]: r["loss"] for r in records}


def _final_params(workdir: Path) -> dict:
  with Checkpointer(str(workdir / CHECKPOINT_DIR), read_only=True) as checkpoints:
    assert checkpoints.all_steps() == [CHECKPOINT_EVERY, STEPS], checkpoints.all_steps()
    params = checkpoints.restore_params(STEPS)
  return {".".join(map(str, k)): np.asarray(v)
          for k, v in traverse_util.flatten_dict(params).items()}


def _data_states(workdir: Path, step: int) -> dict[str, dict]:
  folder = workdir / CHECKPOINT_DIR / str(step) / "data"
  return {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("process_*.json"))}


def test_two_processes_match_one_and_resume(tmp_path):
  cache_dir = tmp_path / "jax_cache"
  multi, single = tmp_path / "two_processes", tmp_path / "one_process"
  logs = tmp_path / "logs"
  logs.mkdir()
  runs = Runs(logs, TIMEOUT_S)
  try:
    # All three processes at once: the 2-process run spends much of its time waiting on
    # the coordinator and gloo, which the reference fills.
    _start_two_processes(runs, multi, cache_dir, "first")
    runs.start("reference", "scripts/train.py", [*_COMMON_FLAGS, f"--workdir={single}",
                                         "--config.distributed.mode=off"],
               environment(4, cache_dir))
    outputs = runs.wait()

    # Only process 0 reports (gloo's own "[Gloo] Rank ..." lines come from both).
    final = _reported(outputs["first_process0"])
    assert len(final) == 1 and final[0]["status"] == "finished" and (
        final[0]["step"] == STEPS), outputs["first_process0"]
    assert not _reported(outputs["first_process1"]), outputs["first_process1"]
    assert "step 1:" not in outputs["first_process1"], outputs["first_process1"]
    # The evaluator ran on both processes (it may use collectives) and agrees.
    assert final[0]["dev/accuracy"] == _reported(outputs["reference"])[0]["dev/accuracy"]

    reference_losses = _losses(single)
    losses = _losses(multi)
    np.testing.assert_allclose([losses[s] for s in sorted(losses)],
                               [reference_losses[s] for s in sorted(reference_losses)],
                               rtol=RTOL, err_msg="2-process vs 1-process loss curve")

    reference_params = _final_params(single)
    params = _final_params(multi)
    assert sorted(params) == sorted(reference_params)
    for name, value in reference_params.items():
      np.testing.assert_allclose(params[name], value, rtol=RTOL, atol=1e-7,
                                 err_msg=f"parameter {name}")

    # One input position per process, each where the one process's input stood.
    for step in (CHECKPOINT_EVERY, STEPS):
      states = _data_states(multi, step)
      assert sorted(states) == ["process_0-of-2.json", "process_1-of-2.json"], states
      assert _data_states(single, step) == {"process_0-of-1.json": states[
          "process_0-of-2.json"]}
      assert states["process_0-of-2.json"] == states["process_1-of-2.json"]

    # Lose the last checkpoint (as if both processes died during steps 4-6) and rerun the
    # same command: it resumes from step 3 and must end where the reference ended.
    shutil.rmtree(multi / CHECKPOINT_DIR / str(STEPS))
    _start_two_processes(runs, multi, cache_dir, "resumed")
    outputs = runs.wait()
    assert f"resumed from {multi / CHECKPOINT_DIR}/{CHECKPOINT_EVERY}" in (
        outputs["resumed_process0"]), outputs["resumed_process0"]
    losses = _losses(multi)  # Steps 1..6 once each: 4..6 were replaced, not appended.
    np.testing.assert_allclose([losses[s] for s in sorted(losses)],
                               [reference_losses[s] for s in sorted(reference_losses)],
                               rtol=RTOL, err_msg="resumed 2-process vs 1-process losses")
    params = _final_params(multi)
    for name, value in reference_params.items():
      np.testing.assert_allclose(params[name], value, rtol=RTOL, atol=1e-7,
                                 err_msg=f"resumed: parameter {name}")
    assert sorted(_data_states(multi, STEPS)) == ["process_0-of-2.json",
                                                  "process_1-of-2.json"]
  finally:
    runs.kill()
