"""The shared trainer on the tests' toy task (tests/toy_task.py), 8 fake CPU devices.

Mesh equivalence, compile-once, NaN handling and accumulation run in this process; resume
after kill -9 and SIGTERM run scripts/train.py in subprocesses, as a user would.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax import nnx
from flax import traverse_util

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.train import loop
from mocheg_jax.train import restore
from mocheg_jax.train import state as state_lib
from mocheg_jax.train.checkpoint import Checkpointer
from mocheg_jax.train.writer import read_metrics
from tests import toy_task
from tests.processes import script_environment

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MESHES = {"data8": (8, 1, 1), "fsdp8": (1, 8, 1), "d2f2t2": (2, 2, 2)}


def toy_config(**overrides):
  config = toy_task.get_config()
  for key, value in overrides.items():
    target = config
    *parents, leaf = key.split(".")
    for parent in parents:
      target = target[parent]
    target[leaf] = value
  return config


def losses(workdir):
  return [r["loss"] for r in read_metrics(workdir) if "loss" in r]


def final_params(workdir):
  with Checkpointer(os.path.join(workdir, loop.CHECKPOINT_DIR), read_only=True) as ckpt:
    return ckpt.restore_params(ckpt.latest_step())


def assert_same_arrays(tree, expected):
  """Equal nested dicts of arrays, keys compared as text (orbax gives list indices so)."""
  flat = lambda t: {tuple(map(str, p)): v for p, v in traverse_util.flatten_dict(t).items()}
  tree, expected = flat(tree), flat(expected)
  assert tree.keys() == expected.keys()
  for path, value in expected.items():
    np.testing.assert_array_equal(tree[path], value, err_msg=str(path))


@pytest.fixture(scope="module")
def one_device_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("one_device"))
  config = toy_config(**{"mesh.data": 1})
  result = loop.train(config, workdir, devices=jax.devices()[:1], log=lambda _: None)
  return workdir, result


def test_toy_task_learns(one_device_run):
  workdir, result = one_device_run
  curve = losses(workdir)
  assert result.status == "finished" and result.step == 20 and len(curve) == 20
  assert np.mean(curve[-5:]) < np.mean(curve[:5]) - 0.05  # It trains, not just runs.
  records = read_metrics(workdir)
  for field in ("learning_rate", "examples_per_s", "step_time_s", "grad_norm"):
    assert field in records[0]
  # No FLOP count on a CPU (no known peak, so no MFU to report, and the count's extra
  # trace would cost CPU runs time): the lines have neither figure.
  assert not any("model_tflops_per_s" in r or "mfu" in r for r in records)
  assert any("dev/accuracy" in r for r in records)


def test_progress_counts_steps_the_device_finished(tmp_path, monkeypatch):
  """The progress line (rate, ETA) counts a step once its outputs are ready, not when it was
  dispatched: each count but the last follows a wait on that step's metrics."""
  events, counted = [], []
  real_wait = jax.block_until_ready

  def wait(tree):
    events.append("wait")
    return real_wait(tree)

  class RecordingProgress(loop.Progress):
    def update(self, n=1):
      events.append("count")
      super().update(n)
      counted.append(self.done)

  monkeypatch.setattr(loop.jax, "block_until_ready", wait)
  monkeypatch.setattr(loop, "Progress", RecordingProgress)
  config = toy_config(**{"mesh.data": 1, "total_steps": 6, "eval_every": 0})
  loop.train(config, str(tmp_path), devices=jax.devices()[:1], log=lambda _: None)
  assert counted == [1, 2, 3, 4, 5, 6]
  assert events == ["wait", "count"] * 5 + ["count"]


def test_load_trained_gives_the_checkpointed_weights(one_device_run):
  workdir, _ = one_device_run
  trained = restore.load_trained(workdir, "latest")
  assert trained.step == 20
  assert_same_arrays(nnx.to_pure_dict(nnx.state(trained.model, nnx.Param)),
                     final_params(workdir)["params"])


def test_opening_checkpoints_read_only_warns_of_nothing(one_device_run, caplog):
  workdir, _ = one_device_run
  with caplog.at_level("WARNING"):
    with Checkpointer(os.path.join(workdir, loop.CHECKPOINT_DIR), read_only=True) as ckpt:
      assert ckpt.latest_step() == 20
  assert not caplog.records, caplog.text  # orbax warned twice per open before.


def _params(model):
  return {tuple(map(str, path)): np.asarray(value) for path, value in
          traverse_util.flatten_dict(nnx.to_pure_dict(nnx.state(model, nnx.Param))).items()}


def test_untrained_is_the_initialisation_with_the_initial_params(monkeypatch):
  config = toy_task.get_config()
  eager = _params(toy_task.make_task(config, "").model())
  name = ("bert", "pooler", "kernel")
  loaded = np.full(eager[name].shape, 0.5, np.float32)

  def with_initial(values):
    task = toy_task.make_task(config, "")
    return lambda *_: dataclasses.replace(task, initial_params=lambda: values)

  monkeypatch.setattr(restore.task_lib, "resolve",
                      lambda _: with_initial(traverse_util.unflatten_dict({name: loaded})))
  ours = _params(restore.untrained(config, "").model)
  assert ours.keys() == eager.keys()
  for path, value in eager.items():  # Compiled apart from the eager build: the last bit.
    expected = loaded if path == name else value
    np.testing.assert_allclose(ours[path], expected, rtol=0, atol=1e-7, err_msg=str(path))
  # Initial parameters the model does not have, or of another shape: named.
  monkeypatch.setattr(restore.task_lib, "resolve",
                      lambda _: with_initial({"bert": {"nope": loaded}}))
  with pytest.raises(MochegInputError, match="'bert.nope', which the model does not have"):
    restore.untrained(config, "")
  monkeypatch.setattr(restore.task_lib, "resolve",
                      lambda _: with_initial(traverse_util.unflatten_dict({name: loaded.T[:1]})))
  with pytest.raises(MochegInputError, match=r"'bert.pooler.kernel' has shape \(1, 32\), "
                     r"the model expects \(32, 32\)"):
    restore.untrained(config, "")


def test_a_program_run_once_is_compiled_cheaply_and_gives_the_jitted_values(monkeypatch):
  from mocheg_jax.utils import run_once
  options = []
  compile_ = jax.stages.Lowered.compile
  monkeypatch.setattr(jax.stages.Lowered, "compile", lambda self, compiler_options=None: (
      options.append(compiler_options), compile_(self, compiler_options))[1])
  draw = jax.jit(lambda key, scale: scale * jax.random.normal(key, (256, 64)))
  args = (jax.random.key(3), 2.0)
  ours = run_once.run_once(draw, *args)
  assert options == [run_once.CHEAP_CPU_COMPILE]  # The tests run on CPU.
  np.testing.assert_allclose(ours, draw(*args), rtol=0, atol=1e-6)


def test_a_config_saved_before_a_field_existed_gets_its_default():
  saved = toy_config().to_dict()
  del saved["data"]["dir"]  # Checkpoints written before `data.dir` existed.
  saved["data"]["scale"] = "small"
  config = restore.saved_config(saved)
  assert config.data.dir == "" and config.data.scale == "small"
  assert config.task == saved["task"] and config.toy.to_dict() == saved["toy"]


def test_a_saved_config_gets_its_task_sections_defaults():
  # A verifier trained before `verify.text_attention` existed still loads, as "learned".
  saved = {"task": "mocheg_jax.verification.task:make_task",
           "verify": {"clip": "/some/clip", "hidden": 7}}
  config = restore.saved_config(saved)
  assert config.verify.clip == "/some/clip" and config.verify.hidden == 7
  assert config.verify.text_attention == "learned"
  assert config.verify.clip_shape.text_hidden > 0  # Nested sections are filled too.
  # Retrieval checkpoints written before their newest fields existed load the same way.
  reranker = restore.saved_config({"task": "mocheg_jax.retrieval.rerank:make_task",
                                   "rerank": {"retriever": "/some/text"}})
  assert reranker.rerank.loss == "bce" and reranker.rerank.retriever == "/some/text"
  text = restore.saved_config({"task": "mocheg_jax.retrieval.text_task:make_task",
                               "retrieval": {"scale": 20.0}})
  assert text.retrieval.mined_negatives == "" and text.retrieval.length_multiple == 0
  # A task module without config_defaults() gets the trainer's defaults only.
  assert "verify" not in restore.saved_config(toy_config().to_dict())


def test_early_stopping_and_a_rerun_after_it(tmp_path):
  # dev/score per step: best 0.7 at step 4; steps 6, 8 and 10 are worse, so with patience 3
  # training stops at step 10 (evaluations every 2 steps), keeping step 4 as the best.
  scores = "0.1,0.5,0.1,0.7,0.1,0.6,0.1,0.65,0.1,0.2" + ",0.9" * 10
  config = toy_config(**{"mesh.data": 1, "total_steps": 20, "eval_every": 2,
                         "checkpoint_every": 100, "best_metric": "dev/score",
                         "early_stopping_patience": 3, "toy.dev_scores": scores})
  run = lambda: loop.train(config, str(tmp_path), devices=jax.devices()[:1],
                           log=lambda _: None)
  result = run()
  assert (result.status, result.step) == ("early_stopped", 10)
  with Checkpointer(os.path.join(tmp_path, loop.CHECKPOINT_DIR), read_only=True,
                    best_metric="dev/score") as ckpt:
    assert ckpt.best() == (4, 0.7) and ckpt.latest_step() == 10
  assert max(r["step"] for r in read_metrics(tmp_path)) == 10
  again = run()  # A rerun does not train on past the stop.
  assert (again.status, again.step) == ("early_stopped", 10)
  assert max(r["step"] for r in read_metrics(tmp_path)) == 10
  config.early_stopping_patience = 0  # Without patience the same run goes to the end.
  assert run().status == "finished"


def test_a_finished_training_reruns_without_building_anything(one_device_run, monkeypatch):
  workdir, first = one_device_run
  config = toy_config(**{"mesh.data": 1})
  built = []
  monkeypatch.setattr(loop.task_lib, "resolve", lambda name: built.append(name))
  lines = []
  again = loop.train(config, workdir, devices=jax.devices()[:1], log=lines.append)
  assert (again.status, again.step) == ("finished", first.step) and not built
  assert lines == [f"finished before: {workdir}/{loop.CHECKPOINT_DIR}/{first.step} is the "
                   "last step of the same config; nothing to do"]
  # Another config (here more steps) is no finished run of it: the task is built to resume.
  config.total_steps += 5
  with pytest.raises(TypeError):  # What the stubbed resolve returned is no task factory.
    loop.train(config, workdir, devices=jax.devices()[:1], log=lines.append)
  assert built == [config.task]


def test_a_training_whose_input_file_changed_is_moved_aside_and_trained_anew(tmp_path):
  data = tmp_path / "evidence.csv"
  data.write_text("claim_id,evidence\n1,a\n")
  workdir = tmp_path / "run"
  config = toy_config(**{"mesh.data": 1, "total_steps": 4, "toy.input_file": str(data)})
  lines = []
  run = lambda: loop.train(config, str(workdir), devices=jax.devices()[:1], log=lines.append)
  first = run()
  assert first.status == "finished" and first.metrics  # Trained, not "finished before".
  first_params = final_params(workdir)
  assert run().metrics == {}  # The same contents: finished before, nothing trained.

  data.write_text("claim_id,evidence\n1,b\n")  # The same path, other contents.
  lines.clear()
  again = run()
  assert again.status == "finished" and again.metrics  # Trained anew.
  aside = workdir / "stale-1"
  assert any("changed since it was trained" in line and str(aside) in line for line in lines)
  assert_same_arrays(final_params(aside), first_params)  # The old training is kept whole.
  assert len(read_metrics(aside)) == len(read_metrics(workdir))
  assert json.loads((workdir / "inputs.json").read_text())[0]["path"] == str(data)
  assert run().metrics == {} and not (workdir / "stale-2").exists()

  # A training written before inputs were recorded is taken as current, and recorded.
  (workdir / "inputs.json").unlink()
  lines.clear()
  assert run().metrics == {} and any("taken as current" in line for line in lines)
  assert (workdir / "inputs.json").exists() and not (workdir / "stale-2").exists()


@pytest.mark.parametrize("name", sorted(MESHES))
def test_mesh_equivalence_and_compiles_once(name, one_device_run, tmp_path, monkeypatch):
  data, fsdp, tensor = MESHES[name]
  traced = []

  def counted(*args, **kwargs):  # The step must be traced exactly once for the whole run.
    step = original(*args, **kwargs)
    traced.append(step)
    return chex.assert_max_traces(step, n=1)

  original = loop.make_train_step
  monkeypatch.setattr(loop, "make_train_step", counted)
  chex.clear_trace_counter()
  config = toy_config(**{"mesh.data": data, "mesh.fsdp": fsdp, "mesh.tensor": tensor,
                         "eval_every": 10, "checkpoint_every": 5})
  loop.train(config, str(tmp_path), log=lambda _: None)
  assert len(traced) == 1
  expected = losses(one_device_run[0])
  np.testing.assert_allclose(losses(str(tmp_path)), expected, rtol=1e-5)


def test_nan_loss_stops_cleanly(tmp_path):
  config = toy_config(**{"toy.nan_from_batch": 13, "checkpoint_every": 5, "log_every": 4})
  with pytest.raises(loop.NonFiniteLossError, match=r"NaN/Inf at step 14.*step 10"):
    loop.train(config, str(tmp_path), log=lambda _: None)
  with Checkpointer(os.path.join(tmp_path, loop.CHECKPOINT_DIR), read_only=True) as ckpt:
    assert ckpt.latest_step() == 10  # Steps 15 and 20 were never saved.
    params = ckpt.restore_params(10)
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))
  assert np.isnan(read_metrics(str(tmp_path))[-1]["loss"])  # The window holding step 14.


def test_gradient_accumulation_matches_one_big_batch(tmp_path):
  """Micro-batches average to the full-batch gradient: same curve within float noise."""
  config = toy_config(**{"total_steps": 6, "accum_steps": 4, "mesh.data": 8})
  loop.train(config, str(tmp_path / "accum"), log=lambda _: None)
  config = toy_config(**{"total_steps": 6, "mesh.data": 8})
  loop.train(config, str(tmp_path / "full"), log=lambda _: None)
  np.testing.assert_allclose(losses(str(tmp_path / "accum")), losses(str(tmp_path / "full")),
                             rtol=2e-5)


def test_frozen_parameters_do_not_move(tmp_path):
  config = toy_config(**{"total_steps": 3, "freeze": r"^bert\.embeddings\.",
                         "checkpoint_every": 1, "keep_checkpoints": 3, "mesh.data": 8})
  loop.train(config, str(tmp_path), log=lambda _: None)
  with Checkpointer(os.path.join(tmp_path, loop.CHECKPOINT_DIR), read_only=True) as ckpt:
    first, last = ckpt.restore_params(1), ckpt.restore_params(3)
  assert set(first["frozen"]["bert"]) == {"embeddings"}
  assert "embeddings" not in first["params"]["bert"]  # No gradient, no optimizer state.
  jax.tree.map(np.testing.assert_array_equal, first["frozen"], last["frozen"])
  assert not np.allclose(first["params"]["classifier"]["kernel"],
                         last["params"]["classifier"]["kernel"])


# ---- as a user runs it: scripts/train.py in a subprocess -------------------------------------
def train_command(workdir, *overrides):
  return [sys.executable, os.path.join(REPO, "scripts", "train.py"),
          f"--config={os.path.join(REPO, 'tests', 'toy_task.py')}", f"--workdir={workdir}",
          *overrides]


def subprocess_env():
  return script_environment(devices=2)


def run(workdir, *overrides, timeout=240):
  done = subprocess.run(train_command(workdir, *overrides), env=subprocess_env(),
                        capture_output=True, text=True, timeout=timeout)
  assert done.returncode == 0, done.stderr[-3000:]
  return done


def wait_for(predicate, proc, timeout=180):
  deadline = time.time() + timeout
  while time.time() < deadline:
    if predicate():
      return
    if proc.poll() is not None:
      raise AssertionError(f"exited early: {proc.communicate()[1][-3000:]}")
    time.sleep(0.1)
  raise AssertionError("timed out")


RESUME_ARGS = ("--config.total_steps=30", "--config.checkpoint_every=10",
               "--config.async_checkpoints=True", "--config.toy.dropout=0.1",
               "--config.toy.sleep_s=0.15", "--config.mesh.data=2")


def test_resume_after_kill_9_equals_uninterrupted_run(tmp_path):
  reference, killed = str(tmp_path / "reference"), str(tmp_path / "killed")
  run(reference, *RESUME_ARGS)
  proc = subprocess.Popen(train_command(killed, *RESUME_ARGS), env=subprocess_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    first = os.path.join(killed, loop.CHECKPOINT_DIR, "10")
    wait_for(lambda: os.path.isdir(first), proc)
    time.sleep(0.5)  # Let it run on past the checkpoint, so there is work to lose.
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == -signal.SIGKILL
  interrupted_at = read_metrics(killed)[-1]["step"]
  assert 10 <= interrupted_at < 30
  done = run(killed, *RESUME_ARGS)
  assert "resumed from" in done.stdout + done.stderr
  steps = [r["step"] for r in read_metrics(killed) if "loss" in r]
  assert steps == list(range(1, 31))  # One clean curve: the lost segment was dropped.
  assert losses(killed) == losses(reference)  # Same data order, same dropout: identical.
  got, want = final_params(killed), final_params(reference)
  jax.tree.map(np.testing.assert_array_equal, got, want)


def test_sigterm_saves_a_checkpoint_and_exits_zero(tmp_path):
  workdir = str(tmp_path)
  proc = subprocess.Popen(train_command(workdir, "--config.total_steps=200",
                                        "--config.checkpoint_every=1000",
                                        "--config.toy.sleep_s=0.1"),
                          env=subprocess_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  try:
    metrics = os.path.join(workdir, "metrics.jsonl")
    wait_for(lambda: os.path.exists(metrics) and len(open(metrics).readlines()) >= 3, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 0, err[-3000:]
  assert "received SIGTERM" in out + err
  status = json.loads(out.strip().splitlines()[-1])
  assert status["status"] == "preempted"
  with Checkpointer(os.path.join(workdir, loop.CHECKPOINT_DIR), read_only=True) as ckpt:
    assert ckpt.latest_step() == status["step"] >= 3


def test_a_stop_signal_on_a_checkpoint_step_stops_with_that_checkpoint(tmp_path):
  """SIGTERM arriving in the step that was just checkpointed: stopped, not an orbax error
  for saving the step twice; the rerun resumes from it."""
  config = toy_config(**{"mesh.data": 1, "total_steps": 8, "log_every": 4,
                         "checkpoint_every": 4, "eval_every": 0})
  workdir = str(tmp_path)

  def log(line: str) -> None:
    if line.startswith("step 4:"):
      os.kill(os.getpid(), signal.SIGTERM)  # Lands in the loop's handler.

  result = loop.train(config, workdir, devices=jax.devices()[:1], log=log)
  assert (result.status, result.step, result.stop) == ("preempted", 4, "SIGTERM")
  with Checkpointer(os.path.join(workdir, loop.CHECKPOINT_DIR), read_only=True) as ckpt:
    assert ckpt.all_steps() == [4]
  lines = []
  rerun = loop.train(config, workdir, devices=jax.devices()[:1], log=lines.append)
  assert (rerun.status, rerun.step) == ("finished", 8)


def test_bad_config_is_one_line_and_exit_1(tmp_path):
  done = subprocess.run(train_command(str(tmp_path), "--config.accum_steps=5"),
                        env=subprocess_env(), capture_output=True, text=True, timeout=120)
  assert done.returncode == 1
  assert "batch_size 16 is not divisible by config.accum_steps 5" in done.stderr
  assert "Traceback" not in done.stderr


def scaled_by_constants_task(config, workdir):
  """The toy task whose loss is multiplied by a Task.constants value."""
  task = toy_task.make_task(config, workdir)

  def loss(model, batch, constants):
    value, metrics = task.loss(model, batch)
    return value * constants["loss_scale"], metrics

  return dataclasses.replace(task, loss=loss,
                             constants=lambda: {"loss_scale": np.float32(3.0)})


def test_task_constants_reach_the_loss_as_a_step_argument(one_device_run, tmp_path,
                                                          monkeypatch):
  """Task.constants: the loss gets them as its third argument (the step's fourth, placed once
  on the devices), so the same run with loss x 3 logs 3x the loss at step 1."""
  passed = []
  original = loop.make_train_step

  def spy(*args, **kwargs):
    passed.append(kwargs.get("with_constants"))
    return original(*args, **kwargs)

  monkeypatch.setattr(loop, "make_train_step", spy)
  config = toy_config(**{"mesh.data": 1, "total_steps": 2, "checkpoint_every": 2,
                         "task": "tests.test_trainer:scaled_by_constants_task"})
  loop.train(config, str(tmp_path), devices=jax.devices()[:1], log=lambda _: None)
  assert passed == [True]
  np.testing.assert_allclose(losses(str(tmp_path))[0], 3 * losses(one_device_run[0])[0],
                             rtol=1e-5)


TRACED_PRECISIONS = []  # precision_watching_task's notes, in tracing order.


def precision_watching_task(config, workdir):
  """The toy task whose loss notes the matmul precision it is traced under."""
  task = toy_task.make_task(config, workdir)

  def loss(model, batch):
    TRACED_PRECISIONS.append(jax.config.jax_default_matmul_precision)
    return task.loss(model, batch)

  return dataclasses.replace(task, loss=loss)


@pytest.mark.parametrize("stage, expected", [("", "bfloat16"), ("float32", "float32")])
def test_a_stage_trains_under_its_own_matmul_precision(stage, expected, tmp_path):
  """config.matmul_precision: "" keeps the job's setting, a name replaces it for the
  training (and only there)."""
  TRACED_PRECISIONS.clear()
  config = toy_config(**{"mesh.data": 1, "total_steps": 2, "checkpoint_every": 2,
                         "matmul_precision": stage,
                         "task": "tests.test_trainer:precision_watching_task"})
  with jax.default_matmul_precision("bfloat16"):
    loop.train(config, str(tmp_path), devices=jax.devices()[:1], log=lambda _: None)
    assert jax.config.jax_default_matmul_precision == "bfloat16"
  assert TRACED_PRECISIONS and set(TRACED_PRECISIONS) == {expected}


def test_an_unknown_matmul_precision_is_refused_naming_the_field(tmp_path):
  config = toy_config(**{"matmul_precision": "bf16"})
  with pytest.raises(ValueError, match="config.matmul_precision: .*bfloat16"):
    loop.train(config, str(tmp_path), log=lambda _: None)


def test_a_training_finished_before_a_trainer_field_existed_stays_finished(
    one_device_run, monkeypatch):
  workdir, first = one_device_run
  original = loop.config_lib.base_config

  def with_a_new_field():
    config = original()
    config.a_new_field = 7  # Absent from the finished run's saved config.
    return config

  monkeypatch.setattr(loop.config_lib, "base_config", with_a_new_field)
  built = []  # A finished training builds no task (a resumed one would, then stop at once).
  monkeypatch.setattr(loop.task_lib, "resolve", lambda name: built.append(name))
  config = toy_config(**{"mesh.data": 1})
  config.a_new_field = 7
  again = loop.train(config, workdir, devices=jax.devices()[:1], log=lambda _: None)
  assert (again.status, again.step) == ("finished", first.step) and not built
  config.a_new_field = 8  # Not the default: another config, so not finished.
  with pytest.raises(TypeError):  # What the stubbed resolve returned is no task factory.
    loop.train(config, workdir, devices=jax.devices()[:1], log=lambda _: None)


def test_a_stop_signal_ends_a_job_step_instead_of_starting_the_next(monkeypatch, capsys):
  from absl import flags
  from mocheg_jax.retrieval import stage as retrieval_stage
  from mocheg_jax.utils import cli
  stopped = loop.TrainResult("preempted", 7, {"loss": 0.5}, "SIGINT")
  monkeypatch.setattr(loop, "train", lambda *args, **kwargs: stopped)
  with pytest.raises(cli.Stopped, match=r"/w/stages/x: training stopped at step 7 by SIGINT; "
                     "checkpoint saved; rerun the same command to resume") as info:
    retrieval_stage._train("x", toy_config(), "/w", log=lambda _: None)
  assert info.value.exit_code == 128 + signal.SIGINT
  preemption = dataclasses.replace(stopped, stop="preemption")  # Multi-process notice.
  monkeypatch.setattr(loop, "train", lambda *args, **kwargs: preemption)
  with pytest.raises(cli.Stopped) as info:
    loop.train_stage(toy_config(), "/w")
  assert info.value.exit_code == 128 + signal.SIGTERM
  finished = loop.TrainResult("finished", 9, {})
  monkeypatch.setattr(loop, "train", lambda *args, **kwargs: finished)
  assert loop.train_stage(toy_config(), "/w") is finished

  def main(argv):
    raise cli.Stopped("the job was told to stop", signal.SIGTERM)

  if not flags.FLAGS.is_parsed():
    flags.FLAGS(["test"])
  with pytest.raises(SystemExit) as exit_info:
    cli.friendly_errors(main)([])
  assert exit_info.value.code == 143
  assert "stopped: the job was told to stop" in capsys.readouterr().err


def test_log_window_reports_mfu_against_the_devices_peak(monkeypatch):
  """Two fake H200s: MFU = counted FLOPs per step x steps / elapsed / (989.4 TFLOP/s x 2)."""
  class FakeDevice:
    device_kind = "NVIDIA H200"

  x, w = jnp.ones((64, 128)), jnp.ones((128, 32))
  window = loop._LogWindow(global_batch=64)
  message = window.count_flops(lambda x, w: x @ w, (x, w), [FakeDevice(), FakeDevice()])
  assert "989.4 TFLOP/s bf16 x 2 devices" in message
  clock = iter([12.0, 12.0])  # The window spans 10 s -> 12 s; then the next one starts.
  monkeypatch.setattr(loop.time, "perf_counter", lambda: next(clock))
  window._start = 10.0
  for _ in range(4):
    window.add({"loss": jnp.float32(1.0)})
  metrics = window.flush()
  flops = 2 * 64 * 128 * 32
  assert metrics["model_tflops_per_s"] == pytest.approx(4 * flops / 2.0 / 1e12)
  assert metrics["mfu"] == pytest.approx(4 * flops / 2.0 / (989.4e12 * 2))


def test_log_window_without_a_static_count_says_why():
  window = loop._LogWindow(global_batch=4)
  loop_fn = lambda x: jax.lax.while_loop(lambda c: c.sum() < 10, lambda c: c @ c, x)  # noqa: E731
  message = window.count_flops(loop_fn, (jnp.eye(2),), jax.devices()[:1])
  assert "not counted" in message and "while loop" in message
  window.add({"loss": jnp.float32(1.0)})
  assert "model_tflops_per_s" not in window.flush()


def test_moving_average_is_evaluated_checkpointed_resumed_and_loaded(tmp_path, monkeypatch):
  """config.ema_decay: the dev evaluation reads the averaged parameters, the checkpoint
  holds them beside the parameters, a resumed run continues the same average, and
  load_trained gives the averaged model."""
  evaluated = []  # The trainable parameters each evaluation's model was built from.
  merge = state_lib.ModelSpec.merge

  def spy(self, params, frozen, others, rng):
    if rng is None:  # The loop's evaluation (training steps reseed the streams).
      evaluated.append(jax.tree.map(np.asarray, params))
    return merge(self, params, frozen, others, rng)

  monkeypatch.setattr(state_lib.ModelSpec, "merge", spy)
  overrides = {"mesh.data": 1, "ema_decay": 0.8, "optimizer.schedule": "constant",
               "eval_every": 10, "checkpoint_every": 10}
  whole, resumed = str(tmp_path / "whole"), str(tmp_path / "resumed")
  loop.train(toy_config(**overrides), whole, devices=jax.devices()[:1], log=lambda _: None)
  loop.train(toy_config(**overrides, total_steps=10), resumed, devices=jax.devices()[:1],
             log=lambda _: None)
  loop.train(toy_config(**overrides), resumed, devices=jax.devices()[:1], log=lambda _: None)
  with Checkpointer(os.path.join(whole, loop.CHECKPOINT_DIR), read_only=True) as ckpt:
    average, last = ckpt.restore_params(20, "ema"), ckpt.restore_params(20)
  with Checkpointer(os.path.join(resumed, loop.CHECKPOINT_DIR), read_only=True) as ckpt:
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 ckpt.restore_params(20, "ema"), average)
  assert not all(np.allclose(a, b) for a, b in zip(jax.tree.leaves(average["params"]),
                                                   jax.tree.leaves(last["params"])))
  assert_same_arrays(evaluated[1], average["params"])  # The evaluation at step 20.
  trained = restore.load_trained(whole, "latest")
  assert_same_arrays(nnx.to_pure_dict(nnx.state(trained.model, nnx.Param)),
                     average["params"])
  with pytest.raises(ValueError, match="config.ema_decay must be a number in"):
    loop.train(toy_config(ema_decay=1.0), str(tmp_path / "bad"), log=lambda _: None)
  # A run saved without an average is not resumed with one (it has none to continue).
  plain = {**overrides, "ema_decay": 0.0, "total_steps": 10}
  loop.train(toy_config(**plain), str(tmp_path / "plain"), devices=jax.devices()[:1],
             log=lambda _: None)
  with pytest.raises(ValueError, match="checkpoints/10 was saved without a moving average"):
    loop.train(toy_config(**overrides), str(tmp_path / "plain"), devices=jax.devices()[:1],
               log=lambda _: None)
