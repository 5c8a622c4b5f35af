"""How the main job configures its stages: a release folder, per-config overrides, the
`paper` models' required folders, and scripts/run_pipeline.py's flags (no training here)."""

import functools
import importlib.util
import pathlib

import jax
import numpy as np
import pytest
from absl import app

from mocheg_jax import workflow
from mocheg_jax.data.report import MochegInputError
from mocheg_jax.models import matmul
from mocheg_jax.parallel import distributed
from mocheg_jax.pipeline import manifest as manifest_lib
from mocheg_jax.utils import configs

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _precision_restored():
  """run_pipeline's main sets JAX's matmul precision for the process (bfloat16 on CPUs with
  AMX by default): each test here gets the process's setting back."""
  before = jax.config.jax_default_matmul_precision
  yield
  jax.config.update("jax_default_matmul_precision", before)


@functools.cache  # Loaded once: its absl flags can be defined only once per process.
def _run_pipeline_script():
  spec = importlib.util.spec_from_file_location("run_pipeline_script",
                                                REPO / "scripts" / "run_pipeline.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_stage_config_reads_the_job_and_applies_overrides(tmp_path):
  config = configs.stage_config("verify", "small", str(tmp_path), 7, release="/data/mocheg",
                                overrides={"verify": {"verify.hidden": 96, "total_steps": 5},
                                           "explain": {"total_steps": 1}})
  assert (config.data.dir, config.data.scale, config.data.release, config.seed) == (
      str(tmp_path), "small", "/data/mocheg", 7)
  assert (config.verify.hidden, config.total_steps) == (96, 5)
  assert configs.release_dir(str(tmp_path)) == str(tmp_path / "release")
  assert configs.release_dir(str(tmp_path), "/data/mocheg") == "/data/mocheg"
  with pytest.raises(MochegInputError, match=r"configs/verify.py has no field 'verify.hiden'"):
    configs.stage_config("verify", "tiny", "w", 0, overrides={"verify": {"verify.hiden": 1}})
  with pytest.raises(MochegInputError, match=r"no field 'hidden.x'"):
    configs.stage_config("verify", "tiny", "w", 0, overrides={"verify": {"hidden.x": 1}})


def test_overrides_and_paper_folders_are_checked_before_any_work(tmp_path):
  workdir = str(tmp_path / "job")
  with pytest.raises(MochegInputError, match=r"unknown configs \['verfy'\]"):
    workflow.run("tiny", workdir, overrides={"verfy": {"total_steps": 1}})
  with pytest.raises(MochegInputError, match="needs local model folders: --bert .*, --bart"):
    workflow.run("paper", workdir, overrides={"retrieval_image": {"model.init": "/m/clip"}})
  assert not (tmp_path / "job" / "release").exists()  # Nothing was written.
  workflow.check_overrides("paper", workdir, 0, {
      "retrieval_image": {"model.init": "/m/clip"}, "classifier": {"classifier.init": "/m/b"},
      "explain": {"explain.init": "/m/bart"}})


def test_run_pipeline_flags_become_overrides(monkeypatch):
  script = _run_pipeline_script()
  assert script.parse_override("verify:total_steps=5000") == ("verify", "total_steps", 5000)
  assert script.parse_override("explain:explain.init=/m/bart-large") == (
      "explain", "explain.init", "/m/bart-large")
  assert script.parse_override("verify:verify.use_image=False")[2] is False
  with pytest.raises(app.UsageError, match="expected CONFIG:dotted.key=value"):
    script.parse_override("total_steps=5")
  calls = []
  monkeypatch.setattr(workflow, "run", lambda *a, **k: calls.append((a, k)))
  argv = ["run_pipeline.py", "--scale=paper", "--workdir=w", "--release=/data/m",
          "--clip=/m/clip", "--bart=/m/bart", "--override=verify:total_steps=9"]
  script.flags.FLAGS(argv)
  try:
    script.main([])
  finally:
    script.flags.FLAGS.unparse_flags()
  (args, kwargs), = calls
  assert args == ("paper", "w") and kwargs["release"] == "/data/m"
  assert kwargs["overrides"] == {"retrieval_image": {"model.init": "/m/clip"},
                                 "explain": {"explain.init": "/m/bart"},
                                 "verify": {"total_steps": 9}}


@pytest.mark.parametrize("flag, env, units, others_units, expected", [
    ("auto", None, True, True, "bfloat16"), ("auto", None, False, True, None),
    ("auto", None, True, False, None),  # Another process's CPU has no bfloat16 unit.
    ("auto", "float32", True, True, "float32"),  # JAX's own setting, given, stays.
    ("float32", None, True, True, "float32"), ("bfloat16", None, False, False, "bfloat16")])
def test_run_pipeline_picks_the_matmul_precision(flag, env, units, others_units, expected,
                                                 monkeypatch):
  script = _run_pipeline_script()
  monkeypatch.setattr(matmul, "cpu_bfloat16_flags", lambda: ("avx512_bf16",) if units else ())
  # A job of two processes, the other one's CPU with or without a bfloat16 unit.
  monkeypatch.setattr(distributed.jax, "process_count", lambda: 2)
  monkeypatch.setattr(distributed.multihost_utils, "process_allgather",
                      lambda x: np.stack([x, np.asarray([int(others_units)], np.int32)]))
  seen = []
  monkeypatch.setattr(workflow, "run",
                      lambda *a, **k: seen.append(jax.config.jax_default_matmul_precision))
  script.flags.FLAGS(["run_pipeline.py", "--scale=tiny", "--workdir=w",
                      f"--matmul_precision={flag}"])
  jax.config.update("jax_default_matmul_precision", env)
  try:
    script.main([])
  finally:
    script.flags.FLAGS.unparse_flags()
  assert seen == [expected]


def test_manifest_names_an_outside_release_by_absolute_path(tmp_path):
  root = tmp_path / "run"
  outside = tmp_path / "mocheg"
  outside.mkdir()
  for stage in manifest_lib.STAGES.values():
    (root / stage / "checkpoints").mkdir(parents=True)
  for index in manifest_lib.INDEXES.values():
    (root / index).mkdir(parents=True)
    (root / index / "manifest.json").write_text("{}")
  manifest_lib.write_manifest(str(root), scale="paper", seed=0, release=str(outside))
  assert manifest_lib.read_manifest(str(root)).release == str(outside)
  (root / "release").mkdir()
  manifest_lib.write_manifest(str(root), scale="tiny", seed=0, release=str(root / "release"))
  assert '"release": "release"' in (root / "manifest.json").read_text()
