"""Running the project's scripts as subprocesses: the script tests and the multi-process
tests.

Every run has its own XLA_FLAGS (the pytest process already has 8 fake devices); a
multi-process job's runs share a persistent compilation cache. Runs that are one job's
processes are started together and waited for with one deadline; a failed process ends the
wait at once (its peers would otherwise block in a collective until the deadline).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from mocheg_jax.utils.host_devices import host_device_flags

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


# XLA's costly CPU optimisations off: compiling is most of what the suite's tiny programs
# cost, and running them unoptimised costs far less than optimising them (measured:
# tests/test_explain_script.py 120 -> 52 CPU-seconds); results agree within every test's
# tolerance.
FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def xla_flags(devices: int = 1) -> str:
  """XLA_FLAGS for a process with `devices` fake CPU devices that compiles fast."""
  return f"{host_device_flags(devices)} {FAST_COMPILE_FLAGS}".strip()


def script_environment(devices: int = 1) -> dict[str, str]:
  """This environment for a script subprocess: `devices` fake CPU devices (one: the
  scripts' default machine), the repository importable, nothing fetched from a hub, and
  nothing that makes the run think it is part of a multi-process job."""
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("JAX_COORDINATOR", "SLURM_", "OMPI_", "MEGASCALE_"))}
  env.update(XLA_FLAGS=xla_flags(devices), JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1",
             TRANSFORMERS_OFFLINE="1",
             PYTHONPATH=os.pathsep.join([str(REPO)] + [p for p in [env.get("PYTHONPATH")] if p]))
  return env


def run_script(script: Path, *args: str, cwd: Path = REPO, timeout_s: float = 300
               ) -> subprocess.CompletedProcess:
  """Runs `python script args` on one CPU device (`script_environment()`), output captured."""
  return subprocess.run([sys.executable, str(script), *args], cwd=cwd,
                        env=script_environment(), capture_output=True, text=True,
                        timeout=timeout_s)


def environment(devices: int, cache_dir: Path) -> dict[str, str]:
  """`script_environment(devices)` sharing a persistent compilation cache in `cache_dir`."""
  env = script_environment(devices)
  env.update(JAX_COMPILATION_CACHE_DIR=str(cache_dir),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  return env


class Runs:
  """Script subprocesses started together, waited for with one deadline, killed if left."""

  def __init__(self, log_dir: Path, timeout_s: float, *, niceness: int = 0):
    self.log_dir, self.timeout_s, self.niceness = log_dir, timeout_s, niceness
    self.procs: list[tuple[str, subprocess.Popen, Path, Path]] = []

  def start(self, name: str, script: str, args: list[str], env: dict[str, str]) -> None:
    """Runs `python REPO/script args` (script: a path relative to the repository)."""
    out, err = self.log_dir / f"{name}.out", self.log_dir / f"{name}.err"
    with open(out, "wb") as o, open(err, "wb") as e:
      proc = subprocess.Popen([sys.executable, str(REPO / script), *args],
                              cwd=REPO, env=env, stdout=o, stderr=e,
                              stdin=subprocess.DEVNULL,
                              preexec_fn=(lambda: os.nice(self.niceness)) if self.niceness
                              else None)
    self.procs.append((name, proc, out, err))

  def _report(self) -> str:
    parts = []
    for name, proc, out, err in self.procs:
      parts.append(f"===== {name}: exit {proc.returncode}\n--- stdout\n"
                   f"{out.read_text(errors='replace')[-4000:]}\n--- stderr\n"
                   f"{err.read_text(errors='replace')[-8000:]}")
    return "\n".join(parts)

  def wait(self) -> dict[str, str]:
    """Waits for every run; fails (with all their output) on the deadline or a non-zero
    exit.

    Returns:
      {name: stdout}.
    """
    deadline = time.monotonic() + self.timeout_s
    procs = [proc for _, proc, _, _ in self.procs]
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
      if any(p.returncode not in (None, 0) for p in procs):
        break
      time.sleep(0.2)
    timed_out = [name for name, proc, _, _ in self.procs if proc.poll() is None]
    self.kill()
    if any(proc.returncode != 0 for proc in procs):
      why = (f"timed out after {self.timeout_s} s: {timed_out}"
             if time.monotonic() >= deadline else "failed")
      raise AssertionError(f"run(s) {why}\n{self._report()}")
    outputs = {name: out.read_text() for name, _, out, _ in self.procs}
    self.procs = []
    return outputs

  def kill(self) -> None:
    for _, proc, _, _ in self.procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()


# A crashed process still fails its run at once: Runs.wait stops at the first non-zero exit.
HEARTBEAT_TIMEOUT_S = 1200


def process_flags(coordinator: str, processes: int, index: int, *,
                  style: str = "config") -> list[str]:
  """The flags that make a script process `index` of a `processes`-process job:
  --config.distributed.* (scripts/train.py) or the plain flags (scripts/run_pipeline.py).

  With HEARTBEAT_TIMEOUT_S: JAX's 100 s default aborted both processes of the niced
  background job once (2026-12-03 CI, 2 cores, "stopped sending heartbeats" while they
  compiled beside the foreground tests)."""
  prefix = "--config.distributed." if style == "config" else "--"
  mode = "mode" if style == "config" else "distributed"
  return [f"{prefix}{mode}=on", f"{prefix}coordinator={coordinator}",
          f"{prefix}num_processes={processes}", f"{prefix}process_id={index}",
          f"{prefix}heartbeat_timeout_s={HEARTBEAT_TIMEOUT_S}"]
