r"""Writes (and with --submit, sbatch's) a SLURM batch script: N nodes x G GPUs, one JAX
process per node, the same command on every node.

  python launch/slurm_gpu.py --nodes=4 --gpus_per_node=8 --workdir=/shared/runs/mocheg \
      --preset=gpu-4x8xh100 \
      --command='python scripts/train.py --config=configs/explain.py:paper \
          --workdir={workdir}/explain --config.explain.init=/shared/models/bart-large' \
      [--partition=P --account=A --time=24:00:00] [--submit] [--dry_run]

The code (--repo, default this checkout) and its venv (--venv, default REPO/.venv, made
once with `python -m venv .venv && .venv/bin/pip install -e . 'jax[cuda12]'`) and the
workdir must be on a filesystem every node mounts. `{workdir}` in --command stands for
--workdir, and every --workdir of the command must lie under it.

How the processes find each other (mocheg_jax/parallel/distributed.py starts
jax.distributed when the environment shows a multi-process job): the script exports
JAX_COORDINATOR_ADDRESS, the first node of the allocation
(`scontrol show hostnames $SLURM_JOB_NODELIST`) and a port, which JAX reads itself; JAX takes
the process count and index from SLURM_NTASKS and SLURM_PROCID of each srun task; and
JAX_LOCAL_DEVICE_IDS gives each process all G GPUs of its node (without it, JAX's SLURM
detection would give a task only the GPU numbered by its SLURM_LOCALID, i.e. GPU 0).
`--signal=TERM@S` asks SLURM for SIGTERM S seconds before the time limit: train.py then
saves a checkpoint and exits 0, and a resubmitted job resumes from it.
--dry_run prints the script and the sbatch command and writes nothing.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import sys

if __package__ in (None, ""):  # Run as a file: make `configs` and `launch` importable.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from configs import presets  # noqa: E402
from launch import common  # noqa: E402
from launch.common import LaunchError  # noqa: E402
from mocheg_jax.utils.cli import friendly_errors  # noqa: E402

MAX_GPUS_PER_NODE = 16


@dataclasses.dataclass(frozen=True)
class Job:
  """A checked batch job."""
  name: str
  nodes: int
  gpus_per_node: int
  command: str  # {workdir} substituted, the preset's flags appended.
  workdir: str
  repo: str
  venv: str
  time: str
  partition: str
  account: str
  cpus_per_task: int
  port: int  # 0: from the job id, as JAX's own SLURM detection picks one.
  signal_seconds: int
  sbatch_lines: tuple[str, ...]

  @property
  def log_dir(self) -> str:
    return os.path.join(self.workdir, "slurm")

  @property
  def script_path(self) -> str:
    return os.path.join(self.log_dir, f"{self.name}.sbatch")


def make_job(*, name: str, nodes: int, gpus_per_node: int, command: str, workdir: str,
             repo: str, venv: str, time: str, partition: str = "", account: str = "",
             cpus_per_task: int = 0, port: int = 0, signal_seconds: int = 120,
             preset: str = "", sbatch_lines: tuple[str, ...] = ()) -> Job:
  """Checks the flags and resolves the command; raises LaunchError naming the flag."""
  if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name or ""):
    raise LaunchError(f"--job_name {name!r}: use letters, digits, '.', '_' and '-'")
  if nodes < 1:
    raise LaunchError(f"--nodes must be at least 1, got {nodes}")
  if not 1 <= gpus_per_node <= MAX_GPUS_PER_NODE:
    raise LaunchError(f"--gpus_per_node must be 1..{MAX_GPUS_PER_NODE}, got {gpus_per_node}")
  if not workdir or not os.path.isabs(workdir):
    raise LaunchError(f"--workdir must be an absolute path on a filesystem every node mounts, "
                      f"got {workdir!r}")
  if not os.path.isabs(repo):
    raise LaunchError(f"--repo must be an absolute path (the code on the shared filesystem), "
                      f"got {repo!r}")
  if not re.fullmatch(r"\d+(-\d{1,2})?(:\d{1,2}){0,2}", time or ""):
    raise LaunchError(f"--time {time!r} is not a SLURM time limit (MINUTES, HH:MM:SS or "
                      "D-HH:MM:SS)")
  if port < 0 or port > 65535:
    raise LaunchError(f"--port {port} is not a TCP port (0: derived from the job id)")
  if signal_seconds < 0:
    raise LaunchError(f"--signal_seconds must be >= 0, got {signal_seconds}")
  for line in sbatch_lines:
    if not line.startswith("--"):
      raise LaunchError(f"--sbatch {line!r}: give an sbatch option such as --exclusive")
  common.split_command(command)
  workdir = os.path.normpath(workdir)
  command = common.substitute(command, {"workdir": workdir})
  if preset:
    hardware = _gpu_preset(preset)
    if hardware.processes != nodes:
      raise LaunchError(f"--preset {preset} is for {hardware.processes} node(s) of "
                        f"{hardware.devices_per_process} GPUs, not {nodes}")
    command = common.with_preset(command, preset, nodes * gpus_per_node)
  for path in common.workdirs(command):
    if not os.path.isabs(path) or not (os.path.normpath(path) + "/").startswith(workdir + "/"):
      raise LaunchError(f"--command's --workdir={path} is not under --workdir {workdir}: "
                        "every node must write to the shared workdir; use "
                        "--workdir={workdir}/...")
  return Job(name=name, nodes=nodes, gpus_per_node=gpus_per_node, command=command,
             workdir=workdir, repo=os.path.normpath(repo), venv=venv or
             os.path.join(repo, ".venv"), time=time, partition=partition, account=account,
             cpus_per_task=cpus_per_task, port=port, signal_seconds=signal_seconds,
             sbatch_lines=tuple(sbatch_lines))


def _gpu_preset(preset: str) -> presets.Hardware:
  try:
    hardware = presets.hardware(preset)
  except presets.PresetError as e:
    raise LaunchError(str(e)) from None
  if hardware.platform != "gpu":
    raise LaunchError(f"--preset {preset} is a {hardware.platform} preset; this launcher "
                      "runs GPU jobs")
  return hardware


def script(job: Job) -> str:
  """The batch script's text."""
  q = shlex.quote
  lines = ["#!/bin/bash",
           f"# Written by launch/slurm_gpu.py: {job.nodes} node(s) x {job.gpus_per_node} GPUs, "
           "one JAX process per node.",
           f"#SBATCH --job-name={job.name}",
           f"#SBATCH --nodes={job.nodes}",
           "#SBATCH --ntasks-per-node=1",
           f"#SBATCH --gpus-per-node={job.gpus_per_node}",
           f"#SBATCH --time={job.time}",
           f"#SBATCH --output={job.log_dir}/%x-%j.out"]
  if job.signal_seconds:
    lines.append(f"#SBATCH --signal=TERM@{job.signal_seconds}")
  if job.partition:
    lines.append(f"#SBATCH --partition={job.partition}")
  if job.account:
    lines.append(f"#SBATCH --account={job.account}")
  if job.cpus_per_task:
    lines.append(f"#SBATCH --cpus-per-task={job.cpus_per_task}")
  lines += [f"#SBATCH {line}" for line in job.sbatch_lines]
  lines += ["", "set -eo pipefail",
            f"cd {q(job.repo)}",
            f"source {q(os.path.join(job.venv, 'bin', 'activate'))}",
            f"mkdir -p {q(job.workdir)}"]
  if job.nodes > 1:
    port = str(job.port) if job.port else "$((61440 + SLURM_JOB_ID % 4096))"
    ids = ",".join(str(i) for i in range(job.gpus_per_node))
    lines += [
        "# jax.distributed: the coordinator runs in process 0, on the first node.",
        'first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f'export JAX_COORDINATOR_ADDRESS="${{first_node}}:{port}"',
        "# All GPUs of a node to its one process (JAX's SLURM detection would give a task",
        "# only the GPU of its SLURM_LOCALID). The process count and index come from",
        "# SLURM_NTASKS and SLURM_PROCID of each task.",
        f"export JAX_LOCAL_DEVICE_IDS={ids}"]
  lines += [f"srun --nodes={job.nodes} --ntasks={job.nodes} --ntasks-per-node=1 "
            f"--kill-on-bad-exit=1 bash -c {q(job.command)}", ""]
  return "\n".join(lines)


def sbatch_command(job: Job) -> list[str]:
  return ["sbatch", job.script_path]


def define_flags() -> None:
  """The command-line flags (defined only when run as a script, so modules can be imported
  together)."""
  d = flags
  d.DEFINE_integer("nodes", 1, "Nodes (one JAX process each).")
  d.DEFINE_integer("gpus_per_node", 8, "GPUs per node.")
  d.DEFINE_string("command", "", "What every node runs in --repo; {workdir} is --workdir.")
  d.DEFINE_string("workdir", "", "Shared-filesystem root of the run's outputs (the batch "
                  "script and logs go to WORKDIR/slurm).")
  d.DEFINE_string("repo", common.REPO, "The code, on the shared filesystem.")
  d.DEFINE_string("venv", "", "Its virtualenv (default: REPO/.venv).")
  d.DEFINE_string("job_name", "mocheg", "SLURM job name.")
  d.DEFINE_string("time", "24:00:00", "Time limit.")
  d.DEFINE_string("partition", "", "SLURM partition (default: the cluster's).")
  d.DEFINE_string("account", "", "SLURM account.")
  d.DEFINE_integer("cpus_per_task", 0, "CPUs per task (0: the cluster's default).")
  d.DEFINE_integer("port", 0, "Coordinator port (0: 61440 + job id % 4096).")
  d.DEFINE_integer("signal_seconds", 120, "SIGTERM this long before the time limit, so the "
                   "trainer checkpoints (0: none).")
  d.DEFINE_multi_string("sbatch", [], "Extra sbatch option, e.g. --exclusive.")
  d.DEFINE_string("preset", "", "A GPU sharding preset (configs/presets.py) whose flags are "
                  "appended to a scripts/train.py command.")
  d.DEFINE_bool("submit", False, "Submit the script with sbatch.")
  d.DEFINE_bool("dry_run", False, "Print the script and the sbatch command; write and run "
                "nothing.")


@friendly_errors
def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  job = make_job(name=f.job_name, nodes=f.nodes, gpus_per_node=f.gpus_per_node,
                 command=f.command, workdir=f.workdir, repo=os.path.abspath(f.repo),
                 venv=f.venv, time=f.time, partition=f.partition, account=f.account,
                 cpus_per_task=f.cpus_per_task, port=f.port,
                 signal_seconds=f.signal_seconds, preset=f.preset,
                 sbatch_lines=tuple(f.sbatch))
  text = script(job)
  if f.dry_run:
    print(text)
    print(shlex.join(sbatch_command(job)))
    return
  activate = os.path.join(job.venv, "bin", "activate")
  if not os.path.isfile(activate):
    raise LaunchError(f"--venv {job.venv} has no bin/activate: make it on the shared "
                      "filesystem first (python -m venv; pip install -e . 'jax[cuda12]')")
  os.makedirs(job.log_dir, exist_ok=True)
  with open(job.script_path, "w", encoding="utf-8") as out:
    out.write(text)
  print(f"wrote {job.script_path}")
  if f.submit:
    common.Runner(dry_run=False).run(sbatch_command(job))
  else:
    print(f"submit with: {shlex.join(sbatch_command(job))}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
