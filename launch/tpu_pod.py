r"""Runs one command on every worker of a Cloud TPU VM slice: create, set up, run, delete.

  python launch/tpu_pod.py --name=mocheg --zone=us-central2-b --accelerator_type=v4-32 \
      --bucket=gs://my-bucket/mocheg --preset=tpu-v4-32 \
      --command='python scripts/train.py --config=configs/explain.py:paper \
          --workdir={bucket}/explain --config.explain.init={bucket}/models/bart-large' \
      [--project=P] [--spot] [--repo=URL --rev=REV] [--delete] [--dry_run]

Steps (each a flag; default: all but --delete):
  --create  gcloud compute tpus tpu-vm create (the runtime version follows the TPU
            generation unless --runtime_version is given).
  --setup   copies the code to every worker (a tarball of --repo when it is a local folder,
            else git clone of --repo at --rev), makes a Python venv with uv (the TPU images
            ship Python 3.10; the package needs >= 3.11), `pip install -e . jax[tpu]`, and
            installs Cloud Storage FUSE.
  --run     on every worker at once (--worker=all): mounts the bucket, activates the venv
            and runs --command in the code's folder.
  --delete  deletes the slice.
--dry_run prints every command, one per line, and runs nothing.

The workdir must be on the bucket, the one place every worker (and a later run) sees: the
trainer writes checkpoints and metrics with ordinary file I/O, so the bucket is mounted on
every worker with gcsfuse at ~/gcs/BUCKET and `{bucket}` in --command stands for the mounted
--bucket path (with --nomount_bucket: the gs:// URL itself). A --workdir off the bucket is
an error. Multi-host slices start jax.distributed from the environment: the run step exports
JAX_COORDINATOR_ADDRESS (worker 0's address, from the metadata server, as JAX itself reads
it), which mocheg_jax/parallel/distributed.py takes as the sign of a multi-process job; JAX
then reads the process count and index from the TPU metadata.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import sys
import tempfile

if __package__ in (None, ""):  # Run as a file: make `configs` and `launch` importable.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from launch import common  # noqa: E402
from launch.common import LaunchError  # noqa: E402
from mocheg_jax.utils.cli import friendly_errors  # noqa: E402

REMOTE_DIR = "~/mocheg-jax"  # The code's folder on every worker.
TARBALL = "mocheg-jax.tar.gz"
# Left out of the tarball of a local checkout: environments, caches, run outputs.
TAR_EXCLUDES = (".git", ".venv", "__pycache__", "*.egg-info", ".pytest_cache", ".ruff_cache",
                "runs", "workdir", "benchmarks/out")
METADATA_ENDPOINTS = ("http://metadata.google.internal/computeMetadata/v1/instance/"
                      "attributes/worker-network-endpoints")


@dataclasses.dataclass(frozen=True)
class Family:
  """A TPU generation: how its accelerator types count, hosts, the runtime for JAX."""
  cores_per_chip: int  # The type's number counts TensorCores (2 a chip) or chips (1).
  chips_per_host: int
  runtime: str
  sizes: tuple[int, ...] | None = None  # The valid numbers; None: multiples of 8.
  max_size: int = 0


# Runtime versions: Cloud TPU's "TPU software versions" table for JAX.
FAMILIES = {
    "v4": Family(2, 4, "tpu-ubuntu2204-base", max_size=8192),
    "v5p": Family(2, 4, "v2-alpha-tpuv5", max_size=12288),
    "v5litepod": Family(1, 8, "v2-alpha-tpuv5-lite", sizes=(1, 4, 8, 16, 32, 64, 128, 256)),
}


@dataclasses.dataclass(frozen=True)
class Slice:
  accelerator_type: str
  chips: int  # = JAX devices (megacore: one device a v4 / v5p chip).
  hosts: int
  runtime: str


def parse_accelerator(accelerator_type: str) -> Slice:
  """The slice an accelerator type names; a LaunchError for an unknown or invalid one."""
  match = re.fullmatch(r"(v4|v5p|v5litepod)-(\d+)", accelerator_type or "")
  expected = ("expected v4-N or v5p-N (N TensorCores, a multiple of 8) or v5litepod-N (N "
              "chips: 1, 4, 8, 16, 32, 64, 128 or 256)")
  if match is None:
    raise LaunchError(f"unknown --accelerator_type {accelerator_type!r}: {expected}")
  family, size = FAMILIES[match.group(1)], int(match.group(2))
  valid = (size in family.sizes if family.sizes else
           size % 8 == 0 and 8 <= size <= family.max_size)
  if not valid:
    raise LaunchError(f"invalid --accelerator_type {accelerator_type!r}: {expected}")
  chips = size // family.cores_per_chip
  return Slice(accelerator_type, chips, max(1, chips // family.chips_per_host),
               family.runtime)


@dataclasses.dataclass(frozen=True)
class Bucket:
  url: str  # gs://NAME[/PREFIX], without a trailing slash.
  name: str
  prefix: str

  @property
  def mount(self) -> str:
    """Where the bucket is mounted on every worker ($HOME expands there)."""
    return f"$HOME/gcs/{self.name}"

  def worker_path(self, mounted: bool) -> str:
    if not mounted:
      return self.url
    return f"{self.mount}/{self.prefix}" if self.prefix else self.mount


def parse_bucket(url: str) -> Bucket:
  match = re.fullmatch(r"gs://([a-z0-9][a-z0-9._-]{1,220}[a-z0-9])(/.*)?", url or "")
  if match is None:
    raise LaunchError(f"--bucket must be a gs://BUCKET[/PREFIX] URL (the workdir root every "
                      f"worker shares), got {url!r}")
  prefix = (match.group(2) or "").strip("/")
  return Bucket(f"gs://{match.group(1)}" + (f"/{prefix}" if prefix else ""), match.group(1),
                prefix)


def _gcloud(verb: str, name: str, zone: str, project: str, *extra: str) -> list[str]:
  argv = ["gcloud", "compute", "tpus", "tpu-vm", verb, name, f"--zone={zone}"]
  if project:
    argv.append(f"--project={project}")
  return argv + list(extra)


def _mount(bucket: Bucket) -> str:
  """Mounts the bucket unless it already is (idempotent: setup and every run call it)."""
  return (f"mkdir -p {bucket.mount} && (mountpoint -q {bucket.mount} || gcsfuse "
          f"--implicit-dirs {bucket.name} {bucket.mount})")


_INSTALL_GCSFUSE = (
    "if ! command -v gcsfuse >/dev/null; then "
    "echo \"deb [signed-by=/usr/share/keyrings/cloud.google.asc] "
    "https://packages.cloud.google.com/apt gcsfuse-$(lsb_release -cs) main\" "
    "| sudo tee /etc/apt/sources.list.d/gcsfuse.list >/dev/null; "
    "curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg "
    "| sudo tee /usr/share/keyrings/cloud.google.asc >/dev/null; "
    "sudo apt-get update -qq && sudo apt-get install -y -qq gcsfuse; fi")


@dataclasses.dataclass(frozen=True)
class Plan:
  """Everything the steps need, checked."""
  name: str
  zone: str
  project: str
  slice: Slice
  runtime: str
  bucket: Bucket
  mount_bucket: bool
  command: str  # With {bucket} substituted and the preset's flags appended.
  repo: str
  rev: str
  spot: bool
  python: str
  coordinator_port: int

  @property
  def local_repo(self) -> bool:
    return os.path.isdir(self.repo)


def create_step(p: Plan) -> list[list[str]]:
  extra = [f"--accelerator-type={p.slice.accelerator_type}", f"--version={p.runtime}"]
  return [_gcloud("create", p.name, p.zone, p.project, *extra,
                  *(["--spot"] if p.spot else []))]


def setup_step(p: Plan) -> list[list[str]]:
  steps, remote = [], []
  if p.local_repo:
    tarball = os.path.join(tempfile.gettempdir(), f"{p.name}-{TARBALL}")
    steps.append(["tar", "-czf", tarball, *(f"--exclude={x}" for x in TAR_EXCLUDES),
                  "-C", os.path.abspath(p.repo), "."])
    scp = ["gcloud", "compute", "tpus", "tpu-vm", "scp", tarball, f"{p.name}:{TARBALL}",
           f"--zone={p.zone}"]
    steps.append(scp + ([f"--project={p.project}"] if p.project else []) + ["--worker=all"])
    remote += [f"rm -rf {REMOTE_DIR}", f"mkdir -p {REMOTE_DIR}",
               f"tar -xzf ~/{TARBALL} -C {REMOTE_DIR}"]
  else:
    remote += [f"rm -rf {REMOTE_DIR}", f"git clone --quiet {shlex.quote(p.repo)} {REMOTE_DIR}"]
    if p.rev:
      remote.append(f"git -C {REMOTE_DIR} checkout --quiet {shlex.quote(p.rev)}")
  remote += [
      # Ubuntu 24.04 images refuse --user installs without --break-system-packages, which
      # the pip of 22.04 does not know.
      "(python3 -m pip install --quiet --user uv || "
      "python3 -m pip install --quiet --user --break-system-packages uv)",
      f"~/.local/bin/uv venv --quiet --seed --python {p.python} {REMOTE_DIR}/.venv",
      f"cd {REMOTE_DIR} && .venv/bin/pip install --quiet -e . 'jax[tpu]'",
  ]
  if p.mount_bucket:
    remote += [_INSTALL_GCSFUSE, _mount(p.bucket)]
  script = "set -eo pipefail; " + "; ".join(remote)
  steps.append(_gcloud("ssh", p.name, p.zone, p.project, "--worker=all",
                       f"--command={script}"))
  return steps


def run_script(p: Plan) -> str:
  """The shell line every worker runs."""
  parts = ["set -eo pipefail"]  # Not -u: the venv's activate script reads unset variables.
  if p.mount_bucket:
    parts.append(_mount(p.bucket))
  parts += [f"cd {REMOTE_DIR}", "source .venv/bin/activate"]
  if p.slice.hosts > 1:
    # Worker 0's address (the metadata lists the workers in process order, "name:id:ip" or
    # a bare host); JAX reads JAX_COORDINATOR_ADDRESS, and the count and index from the
    # metadata.
    parts.append(f"export JAX_COORDINATOR_ADDRESS=\"$(curl -fsS -H 'Metadata-Flavor: Google' "
                 f"{METADATA_ENDPOINTS} | cut -d, -f1 | awk -F: '{{print $NF}}')"
                 f":{p.coordinator_port}\"")
  parts.append(p.command)
  return "; ".join(parts)


def run_step(p: Plan) -> list[list[str]]:
  return [_gcloud("ssh", p.name, p.zone, p.project, "--worker=all",
                  f"--command={run_script(p)}")]


def delete_step(p: Plan) -> list[list[str]]:
  return [_gcloud("delete", p.name, p.zone, p.project, "--quiet")]


STEPS = (("create", create_step), ("setup", setup_step), ("run", run_step),
         ("delete", delete_step))


def make_plan(*, name: str, zone: str, project: str, accelerator_type: str,
              runtime_version: str, bucket: str, command: str, repo: str, rev: str,
              preset: str, spot: bool, mount_bucket: bool, python: str,
              coordinator_port: int, run: bool) -> Plan:
  """Checks the flags and resolves the command; raises LaunchError naming the flag."""
  if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name or ""):
    raise LaunchError(f"--name {name!r} is not a valid TPU name (lower-case letters, digits "
                      "and hyphens, starting with a letter)")
  if not zone:
    raise LaunchError("--zone is required (e.g. us-central2-b for v4, us-west4-a for v5e)")
  slice_ = parse_accelerator(accelerator_type)
  parsed = parse_bucket(bucket)
  if run:
    common.split_command(command, root="bucket")
    root = parsed.worker_path(mount_bucket)
    command = common.substitute(command, {"bucket": root})
    if preset:
      command = common.with_preset(command, preset, slice_.chips)
    for workdir in common.workdirs(command):
      if mount_bucket and workdir.startswith("gs://"):
        raise LaunchError(f"--workdir={workdir}: the trainer writes its workdir with file "
                          f"I/O, so give the mounted bucket path: --workdir={{bucket}}/...")
      if not (workdir == root or workdir.startswith(root.rstrip("/") + "/")):
        raise LaunchError(f"--workdir={workdir} is not on --bucket {parsed.url}: every "
                          "worker must write to the shared bucket; use --workdir={bucket}/...")
  if not os.path.isdir(repo) and not re.match(r"^(https?://|ssh://|git@|file://)", repo or ""):
    raise LaunchError(f"--repo {repo!r} is neither a local folder nor a git URL")
  if coordinator_port <= 0 or coordinator_port > 65535:
    raise LaunchError(f"--coordinator_port {coordinator_port} is not a TCP port")
  return Plan(name=name, zone=zone, project=project, slice=slice_,
              runtime=runtime_version or slice_.runtime, bucket=parsed,
              mount_bucket=mount_bucket, command=command, repo=repo, rev=rev, spot=spot,
              python=python, coordinator_port=coordinator_port)


def commands(plan: Plan, steps: dict[str, bool]) -> list[list[str]]:
  """Every command of the chosen steps, in order."""
  out = []
  for step, build in STEPS:
    if steps.get(step):
      out += build(plan)
  return out


def execute(plan: Plan, steps: dict[str, bool], runner: common.Runner) -> None:
  """Runs the chosen steps in order; with --delete the slice is deleted even when an
  earlier step failed (a failed run should not leave a slice billing)."""
  try:
    for argv in commands(plan, {**steps, "delete": False}):
      runner.run(argv)
  finally:
    if steps.get("delete"):
      for argv in delete_step(plan):
        runner.run(argv)


def define_flags() -> None:
  """The command-line flags (defined only when run as a script, so modules can be imported
  together)."""
  d = flags
  d.DEFINE_string("name", None, "The TPU VM (slice) name.")
  d.DEFINE_string("zone", None, "Its zone, e.g. us-central2-b.")
  d.DEFINE_string("project", "", "Google Cloud project (default: gcloud's).")
  d.DEFINE_string("accelerator_type", None, "v4-N, v5p-N or v5litepod-N, e.g. v4-32.")
  d.DEFINE_string("runtime_version", "", "TPU software version (default: the generation's "
                  "for JAX).")
  d.DEFINE_string("bucket", None, "gs://BUCKET[/PREFIX]: the workdir root.")
  d.DEFINE_string("command", "", "What every worker runs, in the code's folder; {bucket} is "
                  "the bucket path on the workers.")
  d.DEFINE_string("repo", common.REPO, "A local checkout (copied as a tarball) or a git URL "
                  "(cloned on every worker).")
  d.DEFINE_string("rev", "", "With a git --repo: the revision to check out.")
  d.DEFINE_string("preset", "", "A sharding preset (configs/presets.py) whose flags are "
                  "appended to a scripts/train.py command.")
  d.DEFINE_bool("spot", False, "Create a Spot TPU (preemptible, cheaper).")
  d.DEFINE_bool("mount_bucket", True, "Mount the bucket with gcsfuse on every worker "
                "({bucket} = the mount).")
  d.DEFINE_string("python", "3.12", "Python version of the workers' venv.")
  d.DEFINE_integer("coordinator_port", 8482, "jax.distributed coordinator port.")
  d.DEFINE_bool("create", True, "Step: create the slice.")
  d.DEFINE_bool("setup", True, "Step: copy the code, install it, mount the bucket.")
  d.DEFINE_bool("run", True, "Step: run --command on every worker.")
  d.DEFINE_bool("delete", False, "Step: delete the slice (after the others, even failed).")
  d.DEFINE_bool("dry_run", False, "Print the commands, one per line; run nothing.")


@friendly_errors
def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  for name in ("name", "zone", "accelerator_type", "bucket"):
    if not f[name].value:
      raise LaunchError(f"--{name} is required")
  steps = {step: f[step].value for step in ("create", "setup", "run", "delete")}
  if not any(steps.values()):
    raise LaunchError("no step chosen: --create, --setup, --run or --delete")
  plan = make_plan(name=f.name, zone=f.zone, project=f.project,
                   accelerator_type=f.accelerator_type, runtime_version=f.runtime_version,
                   bucket=f.bucket, command=f.command, repo=f.repo, rev=f.rev,
                   preset=f.preset, spot=f.spot, mount_bucket=f.mount_bucket,
                   python=f.python, coordinator_port=f.coordinator_port, run=f.run)
  execute(plan, steps, common.Runner(f.dry_run))


if __name__ == "__main__":
  define_flags()
  app.run(main)
