"""launch/ (Cloud TPU and SLURM launchers), configs/presets.py and launch/memory.py.

Nothing here reaches a network or runs gcloud / sbatch: the launchers are checked through
their --dry_run output and the commands they build; a subprocess run puts fake `gcloud`,
`tar` and `sbatch` first on PATH that would leave a mark if anything were executed.
"""

from __future__ import annotations

import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from configs import presets
from launch import common, memory, slurm_gpu, tpu_pod
from launch.common import LaunchError

REPO = Path(__file__).resolve().parents[1]
TRAIN = "python scripts/train.py --config=configs/explain.py:paper --workdir={bucket}/explain"


def _plan(**overrides) -> tpu_pod.Plan:
  kw = dict(name="mocheg", zone="us-central2-b", project="proj", accelerator_type="v4-32",
            runtime_version="", bucket="gs://my-bucket/runs", command=TRAIN, repo=str(REPO),
            rev="", preset="", spot=False, mount_bucket=True, python="3.12",
            coordinator_port=8482, run=True)
  kw.update(overrides)
  return tpu_pod.make_plan(**kw)


DEFAULT_STEPS = {"create": True, "setup": True, "run": True, "delete": False}


def _verbs(cmds: list[list[str]]) -> list[str]:
  """'create', 'tar', 'scp', 'ssh', 'delete' per command."""
  return [c[0] if c[0] != "gcloud" else c[4] for c in cmds]


def _remote(cmd: list[str]) -> str:
  (flag,) = [a for a in cmd if a.startswith("--command=")]
  return flag.split("=", 1)[1]


# ---- Cloud TPU --------------------------------------------------------------------------------
def test_tpu_steps_in_order_and_delete_only_when_asked():
  plan = _plan(spot=True)
  cmds = tpu_pod.commands(plan, DEFAULT_STEPS)
  assert _verbs(cmds) == ["create", "tar", "scp", "ssh", "ssh"]
  create = cmds[0]
  assert create[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "mocheg"]
  for flag in ("--zone=us-central2-b", "--project=proj", "--accelerator-type=v4-32",
               "--version=tpu-ubuntu2204-base", "--spot"):
    assert flag in create
  assert cmds[2][5:7] == [cmds[1][2], "mocheg:mocheg-jax.tar.gz"]  # scp of the tarball.
  for cmd in cmds[2:]:
    assert "--worker=all" in cmd
  setup, run = _remote(cmds[3]), _remote(cmds[4])
  assert "pip install --quiet -e . 'jax[tpu]'" in setup and "gcsfuse" in setup
  assert setup.index("tar -xzf") < setup.index("pip install")
  # The user's command last, with {bucket} on the mounted bucket, after the coordinator.
  assert run.endswith("python scripts/train.py --config=configs/explain.py:paper "
                      "--workdir=$HOME/gcs/my-bucket/runs/explain")
  assert run.index("source .venv/bin/activate") < run.index("JAX_COORDINATOR_ADDRESS")
  assert "worker-network-endpoints" in run and ":8482" in run

  with_delete = tpu_pod.commands(plan, {**DEFAULT_STEPS, "delete": True})
  assert _verbs(with_delete) == ["create", "tar", "scp", "ssh", "ssh", "delete"]
  assert "--quiet" in with_delete[-1]
  assert _verbs(tpu_pod.commands(plan, {"delete": True})) == ["delete"]


def test_tpu_git_repo_single_host_and_unmounted_bucket():
  plan = _plan(accelerator_type="v5litepod-8", repo="https://github.com/o/mocheg-jax.git",
               rev="abc123", mount_bucket=False,
               command="python scripts/train.py --config=configs/verify.py:paper "
                       "--workdir={bucket}/verify")
  assert (plan.slice.chips, plan.slice.hosts, plan.runtime) == (8, 1, "v2-alpha-tpuv5-lite")
  cmds = tpu_pod.commands(plan, {"setup": True, "run": True})
  assert _verbs(cmds) == ["ssh", "ssh"]  # No tarball to copy.
  setup, run = _remote(cmds[0]), _remote(cmds[1])
  assert "git clone --quiet https://github.com/o/mocheg-jax.git ~/mocheg-jax" in setup
  assert "checkout --quiet abc123" in setup and "gcsfuse" not in setup
  assert "JAX_COORDINATOR_ADDRESS" not in run  # One host: no jax.distributed.
  assert run.endswith("--workdir=gs://my-bucket/runs/verify")


def test_tpu_accelerator_types():
  assert tpu_pod.parse_accelerator("v4-32") == tpu_pod.Slice("v4-32", 16, 4,
                                                             "tpu-ubuntu2204-base")
  assert tpu_pod.parse_accelerator("v5litepod-256").hosts == 32
  assert tpu_pod.parse_accelerator("v5p-128").chips == 64
  for bad in ("v4-33", "v4-4", "v5litepod-12", "v3-8", "tpu-v4-32", ""):
    with pytest.raises(LaunchError, match="accelerator_type"):
      tpu_pod.parse_accelerator(bad)


def test_tpu_preset_flags_appended_and_checked():
  (cmd,) = tpu_pod.run_step(_plan(preset="tpu-v4-32"))
  run = _remote(cmd)
  assert run.endswith(" ".join(presets.preset_flags("tpu-v4-32", "explain")))
  assert "--config.mesh.fsdp=16" in run
  with pytest.raises(LaunchError, match="256 devices, but this job has 16"):
    _plan(preset="tpu-v5e-256")
  with pytest.raises(LaunchError, match="needs a scripts/train.py command"):
    _plan(preset="tpu-v4-32", command="python scripts/run_pipeline.py --workdir={bucket}/x")


@pytest.mark.parametrize("overrides, message", [
    (dict(bucket="my-bucket/runs"), "--bucket must be a gs://"),
    (dict(bucket="gs://"), "--bucket must be a gs://"),
    (dict(command="   "), "--command is empty"),
    (dict(command="python x.py 'unbalanced"), "not valid shell syntax"),
    (dict(command="python scripts/train.py --workdir runs/local"), "is not on --bucket"),
    (dict(command="python scripts/train.py --workdir=gs://my-bucket/runs/x"),
     "give the mounted bucket path"),
    (dict(name="Bad_Name"), "not a valid TPU name"),
    (dict(repo="not/a/folder"), "neither a local folder nor a git URL"),
    (dict(preset="gpu-9000"), "unknown sharding preset"),
])
def test_tpu_bad_inputs(overrides, message):
  with pytest.raises(LaunchError, match=message):
    _plan(**overrides)


def test_tpu_delete_runs_after_a_failed_step():
  class FailingRunner:
    def __init__(self):
      self.ran = []

    def run(self, argv):
      self.ran.append(argv)
      if "ssh" in argv:
        raise LaunchError("ssh failed")

  runner = FailingRunner()
  with pytest.raises(LaunchError, match="ssh failed"):
    tpu_pod.execute(_plan(), {**DEFAULT_STEPS, "delete": True}, runner)
  assert _verbs(runner.ran) == ["create", "tar", "scp", "ssh", "delete"]


def _fake_tools(tmp_path: Path) -> tuple[dict[str, str], Path]:
  """PATH with gcloud / tar / sbatch that leave a mark when run."""
  bin_dir, mark = tmp_path / "bin", tmp_path / "executed"
  bin_dir.mkdir()
  for tool in ("gcloud", "tar", "sbatch", "srun", "scontrol"):
    path = bin_dir / tool
    path.write_text(f"#!/bin/sh\necho {tool} >> {mark}\n")
    path.chmod(0o755)
  env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
  return env, mark


def _launch(script: str, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, str(REPO / "launch" / script), *args], cwd=REPO,
                        env=env, capture_output=True, text=True, timeout=60)


def test_tpu_dry_run_prints_one_command_per_line_and_runs_nothing(tmp_path):
  env, mark = _fake_tools(tmp_path)
  args = ["--name=mocheg", "--zone=us-central2-b", "--accelerator_type=v4-32",
          "--bucket=gs://my-bucket/runs", f"--command={TRAIN}", "--preset=tpu-v4-32",
          "--delete", "--dry_run"]
  done = _launch("tpu_pod.py", args, env)
  assert done.returncode == 0, done.stderr
  lines = done.stdout.strip().splitlines()
  expected = tpu_pod.commands(_plan(project="", preset="tpu-v4-32"),
                              {**DEFAULT_STEPS, "delete": True})
  assert lines == [shlex.join(c) for c in expected]
  assert [shlex.split(line) for line in lines] == expected  # Each line is one command.
  assert not mark.exists()

  bad = _launch("tpu_pod.py", [a for a in args if not a.startswith("--bucket")]
                + ["--bucket=/mnt/local"], env)
  assert bad.returncode == 1 and not mark.exists()
  assert bad.stderr.strip().startswith("error: --bucket must be a gs://")
  assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


# ---- SLURM ------------------------------------------------------------------------------------
def _job(**overrides) -> slurm_gpu.Job:
  kw = dict(name="mocheg", nodes=4, gpus_per_node=8,
            command="python scripts/train.py --config=configs/explain.py:paper "
                    "--workdir={workdir}/explain",
            workdir="/shared/runs/m", repo="/shared/mocheg-jax", venv="", time="24:00:00",
            partition="gpu", account="acct")
  kw.update(overrides)
  return slurm_gpu.make_job(**kw)


def test_slurm_script():
  text = slurm_gpu.script(_job(preset="gpu-4x8xh100"))
  lines = text.splitlines()
  assert lines[0] == "#!/bin/bash"
  for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1",
               "#SBATCH --gpus-per-node=8", "#SBATCH --partition=gpu",
               "#SBATCH --account=acct", "#SBATCH --signal=TERM@120",
               "#SBATCH --output=/shared/runs/m/slurm/%x-%j.out",
               "source /shared/mocheg-jax/.venv/bin/activate",
               "export JAX_LOCAL_DEVICE_IDS=0,1,2,3,4,5,6,7"):
    assert line in lines, line
  order = [next(i for i, l in enumerate(lines) if l.startswith(p)) for p in
           ("#SBATCH --nodes", "source ", "first_node=$(scontrol show hostnames",
            'export JAX_COORDINATOR_ADDRESS="${first_node}:', "srun ")]
  assert order == sorted(order)
  srun = shlex.split(lines[order[-1]])
  assert srun[:6] == ["srun", "--nodes=4", "--ntasks=4", "--ntasks-per-node=1",
                      "--kill-on-bad-exit=1", "bash"]
  assert srun[7] == ("python scripts/train.py --config=configs/explain.py:paper "
                     "--workdir=/shared/runs/m/explain "
                     + " ".join(presets.preset_flags("gpu-4x8xh100", "explain")))
  # One node: one process, no jax.distributed start-up.
  single = slurm_gpu.script(_job(nodes=1, gpus_per_node=2, port=1234))
  assert "JAX_COORDINATOR_ADDRESS" not in single and "#SBATCH --gpus-per-node=2" in single
  assert '${first_node}:1234"' in slurm_gpu.script(_job(port=1234))


@pytest.mark.parametrize("overrides, message", [
    (dict(nodes=0), "--nodes must be at least 1"),
    (dict(gpus_per_node=0), "--gpus_per_node"),
    (dict(workdir="runs/m"), "--workdir must be an absolute path"),
    (dict(command=""), "--command is empty"),
    (dict(command="python scripts/train.py --workdir=/tmp/elsewhere"), "not under --workdir"),
    (dict(command="python scripts/train.py --workdir /shared/runs/mx"), "not under --workdir"),
    (dict(time="tomorrow"), "not a SLURM time limit"),
    (dict(preset="tpu-v4-32"), "is a tpu preset"),
    (dict(preset="gpu-8xh100"), "is for 1 node"),
    (dict(name="my job"), "--job_name"),
])
def test_slurm_bad_inputs(overrides, message):
  with pytest.raises(LaunchError, match=message):
    _job(**overrides)


def test_slurm_dry_run_writes_and_runs_nothing_then_writes_the_script(tmp_path):
  env, mark = _fake_tools(tmp_path)
  workdir = tmp_path / "shared" / "runs"
  args = ["--nodes=2", "--gpus_per_node=4", f"--workdir={workdir}",
          "--command=python scripts/train.py --config=configs/verify.py:paper "
          "--workdir={workdir}/verify"]
  done = _launch("slurm_gpu.py", args + ["--dry_run"], env)
  assert done.returncode == 0, done.stderr
  out = done.stdout.strip().splitlines()
  assert out[0] == "#!/bin/bash" and "#SBATCH --nodes=2" in out
  assert out[-1] == f"sbatch {workdir}/slurm/mocheg.sbatch"
  assert not workdir.exists() and not mark.exists()

  venv = tmp_path / "venv"
  (venv / "bin").mkdir(parents=True)
  (venv / "bin" / "activate").write_text("")
  written = _launch("slurm_gpu.py", args + [f"--venv={venv}"], env)
  assert written.returncode == 0, written.stderr
  script = (workdir / "slurm" / "mocheg.sbatch").read_text()
  assert f"source {venv}/bin/activate" in script and "--workdir=" + str(workdir) in script
  assert not mark.exists()  # Without --submit, sbatch is not run.

  bad = _launch("slurm_gpu.py", ["--nodes=2", "--workdir=relative", "--command=ls"], env)
  assert bad.returncode == 1 and "Traceback" not in bad.stderr
  assert bad.stderr.strip() == ("error: --workdir must be an absolute path on a filesystem "
                                "every node mounts, got 'relative'")


# ---- presets ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def paper_configs():
  return {stage: memory.load_config(stage) for stage in presets.STAGES}


def test_every_preset_covers_its_devices():
  assert set(presets.PRESETS) == set(presets.HARDWARE)
  assert presets.hardware("tpu-v4-32").devices == 16  # v4-32: 32 TensorCores, 16 chips.
  assert presets.hardware("tpu-v5e-256").devices == 256
  for name, stages in presets.PRESETS.items():
    hw = presets.hardware(name)
    assert set(stages) == set(presets.STAGES), name
    for stage in presets.STAGES:
      if not presets.supported(name, stage):
        continue
      mesh = presets.plan(name, stage)["mesh"]
      assert math.prod(mesh[f] for f in presets.MESH_FIELDS) == hw.devices, (name, stage)
      if hw.platform == "tpu":  # One slice: nothing on DCN.
        assert all(mesh[f] == 1 for f in ("dcn_data", "dcn_fsdp", "dcn_tensor"))


def test_presets_fit_the_paper_configs_and_build_meshes(paper_configs):
  import jax
  from mocheg_jax.parallel import mesh as mesh_lib

  for name in presets.preset_names():
    hw = presets.hardware(name)
    for stage, config in paper_configs.items():
      assert presets.stage_of_task(config.task) == stage
      if not presets.supported(name, stage):
        # The reason is real: the paper batch does not split over the processes.
        with pytest.raises(presets.PresetError, match="does not split"):
          presets.plan(name, stage)
        assert config.batch_size % hw.processes
        continue
      accum = presets.plan(name, stage)["accum_steps"] or config.accum_steps
      presets.check_plan(name, stage, config.batch_size, accum)
      if hw.devices == jax.device_count():  # The 8-GPU presets on the 8 fake CPU devices.
        mesh = mesh_lib.make_mesh(presets.plan(name, stage)["mesh"])
        assert math.prod(mesh.axis_sizes) == 8
  with pytest.raises(presets.PresetError, match="does not split 8 ways"):
    presets.check_plan("gpu-8xh100", "classifier", 36, 1)


def test_apply_preset_and_flags(paper_configs):
  config = memory.load_config("explain")
  presets.apply_preset(config, "tpu-v4-32")
  assert (config.mesh.data, config.mesh.fsdp, config.mesh.tensor) == (1, 16, 1)
  assert config.accum_steps == 4
  flags = presets.preset_flags("gpu-4x8xh100", "classifier")
  assert flags == ["--config.mesh.data=2", "--config.mesh.fsdp=1", "--config.mesh.tensor=4",
                   "--config.mesh.dcn_data=4", "--config.mesh.dcn_fsdp=1",
                   "--config.mesh.dcn_tensor=1"]
  odd = memory.load_config("classifier")
  odd.batch_size = 36
  with pytest.raises(presets.PresetError, match="36 rows"):
    presets.apply_preset(odd, "gpu-8xh100")
  assert presets.stage_of_command(
      "python scripts/train.py --config configs/rerank.py:paper --workdir=x") == "rerank"
  assert presets.stage_of_command("python scripts/train.py --config=my.py") is None


# ---- memory model -----------------------------------------------------------------------------
def test_memory_matches_a_hand_computation(paper_configs):
  # gpu-8xh100, classifier: BERT-base, batch 40 over data 8 -> 5 rows, 512 tokens, no sharding.
  row = memory.estimate("gpu-8xh100", "classifier", paper_configs["classifier"])
  total, frozen = 109_582_787, 30_925_056
  gib = 2 ** 30
  assert row.rows == 5
  assert row.params == pytest.approx(4 * total / gib)
  assert row.grads == pytest.approx(4 * (total - frozen) / gib)
  assert row.adam == pytest.approx(8 * (total - frozen) / gib)
  # Per layer: 512 x (4 x 768 + 4 x 768 + 2 x 3072) + 2 x 12 x 512^2 values; 12 layers.
  per_example = 12 * (512 * (4 * 768 + 4 * 768 + 2 * 3072) + 2 * 12 * 512 ** 2)
  assert per_example == 150_994_944
  assert row.activations == pytest.approx(4 * 5 * per_example / gib)  # 2.8125 GiB.
  assert row.total == pytest.approx(row.params + row.grads + row.adam + 2.8125)


def test_memory_sharding_and_fit(paper_configs):
  rows = [memory.estimate(p, s, paper_configs[s]) for p in presets.preset_names()
          for s in presets.STAGES if presets.supported(p, s)]
  bad = [(r.preset, r.stage, round(r.total, 1)) for r in rows if not r.fits]
  assert not bad, f"presets over {memory.FIT_FRACTION:.0%} of device memory: {bad}"
  by_key = {(r.preset, r.stage): r for r in rows}
  # fsdp 16 splits BART's trained state 16 ways; the reward classifier stays whole.
  v4 = by_key[("tpu-v4-32", "explain")]
  assert v4.adam == pytest.approx(8 * (406_341_721 - 50_265) / 16 / 2 ** 30)
  assert v4.params == pytest.approx(4 * (406_341_721 / 16 + 203_812_035) / 2 ** 30)
  assert v4.grads == pytest.approx(2 * 4 * (406_341_721 - 50_265) / 16 / 2 ** 30)  # accum 4.
  # Tensor parallelism divides the activations that divide (BERT's MLP by 32, not its heads).
  t32 = memory.encoder_layer(512, memory.BERT_BASE, 32)
  assert t32 == 512 * 4 * 768 * 2 + 512 * 2 * 3072 / 32 + 2 * 12 * 512 ** 2
  table = memory.table(rows + [memory.Unsupported("tpu-v5e-256", "classifier", "why")])
  assert table.count("\n") == len(rows) + 2 and "| gpu-8xh200 | explain | 1x8x1 | 2 |" in table
  assert "| tpu-v5e-256 | classifier | not supported: why |" in table


def test_memory_script_prints_flags(tmp_path):
  env, _ = _fake_tools(tmp_path)
  done = _launch("memory.py", ["--flags", "--preset=tpu-v5e-256", "--stage=explain"], env)
  assert done.returncode == 0, done.stderr
  assert done.stdout.split() == presets.preset_flags("tpu-v5e-256", "explain")
  bad = _launch("memory.py", ["--preset=tpu-v9"], env)
  assert bad.returncode == 1 and bad.stderr.startswith("error: unknown sharding preset")


def test_param_counts_match_our_modules():
  import jax
  from flax import nnx
  from mocheg_jax.models import bert

  minilm = bert.BertConfig(hidden_size=384, num_hidden_layers=6, intermediate_size=1536)
  model = nnx.eval_shape(lambda: bert.SentenceEncoder(minilm, rngs=nnx.Rngs(0)))
  count = sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  assert count == memory.PARAMS["retrieval_text"].train


def test_common_helpers():
  assert common.workdirs("python t.py --workdir=/a --x=1 --workdir /b") == ["/a", "/b"]
  assert common.substitute("--w={bucket}/x ${HOME} {other}", {"bucket": "B"}) == \
      "--w=B/x ${HOME} {other}"
