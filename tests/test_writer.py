"""MetricWriter: metrics.jsonl round trip, TensorBoard read back independently, resume."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.backend.event_processing import plugin_event_accumulator
from tensorboard.util import tensor_util

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.train import writer as writer_lib
from mocheg_jax.train.writer import MetricWriter, read_metrics


def _strict_json(line: str) -> dict:
  """Parses like a standard JSON parser: NaN/Infinity tokens are an error."""
  def reject(token):
    raise ValueError(f"non-standard JSON token {token}")
  return json.loads(line, parse_constant=reject)


def _scalars(workdir) -> dict[str, list[tuple[int, float]]]:
  """Every scalar curve in workdir/tensorboard, read by TensorBoard's own loader."""
  acc = event_accumulator.EventAccumulator(os.path.join(workdir, "tensorboard"))
  acc.Reload()
  return {tag: [(e.step, e.value) for e in acc.Scalars(tag)]
          for tag in acc.Tags()["scalars"]}


def _plugin_scalars(workdir) -> dict[str, list[tuple[int, float]]]:
  """The same through the loader that `tensorboard --load_fast=false` serves from."""
  acc = plugin_event_accumulator.EventAccumulator(os.path.join(workdir, "tensorboard"))
  acc.Reload()
  return {tag: [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
                for e in acc.Tensors(tag)]
          for tag in acc.Tags()["tensors"]}


def _write_steps(workdir, steps, scale, **kwargs):
  with MetricWriter(workdir, **kwargs) as w:
    for step in steps:
      w.write(step, {"train/loss": scale * step, "lr": 0.5})


def test_round_trip_with_numpy_jax_and_nonfinite(tmp_path):
  with MetricWriter(tmp_path) as w:
    w.write(1, {"train/loss": 2.5, "count": 7, "flag": True})
    w.write(np.int64(2), {"train/loss": np.float32(1.25), "count": np.int64(9),
                          "acc": np.array(0.75)})
    w.write(3, {"train/loss": jnp.float32(0.5), "count": jnp.int32(11),
                "bf16": jnp.array(1.5, jnp.bfloat16)})
    w.write(4, {"train/loss": jnp.float32(jnp.nan), "grad_norm": float("inf"),
                "neg": -np.inf, "count": 0})

  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
  assert len(lines) == 4
  raw = [_strict_json(line) for line in lines]  # Every line is standard JSON.
  assert raw[3] == {"step": 4, "train/loss": "nan", "grad_norm": "inf", "neg": "-inf",
                    "count": 0}
  assert list(raw[2]) == ["step", "train/loss", "count", "bf16"]  # Caller's key order.

  records = read_metrics(tmp_path)
  assert records[:3] == [
      {"step": 1, "train/loss": 2.5, "count": 7, "flag": 1},
      {"step": 2, "train/loss": 1.25, "count": 9, "acc": 0.75},
      {"step": 3, "train/loss": 0.5, "count": 11, "bf16": 1.5},
  ]
  for record in records[:3]:
    assert type(record["count"]) is int and type(record["train/loss"]) is float
  last = records[3]
  assert math.isnan(last["train/loss"])
  assert last["grad_norm"] == math.inf and last["neg"] == -math.inf


def test_tensorboard_matches_jsonl(tmp_path):
  values = {1: 0.1, 2: float("nan"), 5: 3.0e-4, 9: -7.25}
  with MetricWriter(tmp_path) as w:
    for step, v in values.items():
      w.write(step, {"train/loss": jnp.float32(v), "tokens": np.int64(step * 100)})
  curves = _scalars(tmp_path)
  assert set(curves) == {"train/loss", "tokens"}
  loss = curves["train/loss"]
  assert [s for s, _ in loss] == list(values)
  np.testing.assert_allclose([v for _, v in loss], list(values.values()), rtol=1e-6)
  assert math.isnan(loss[1][1])
  assert curves["tokens"] == [(s, s * 100.0) for s in values]
  assert [r["step"] for r in read_metrics(tmp_path)] == list(values)


def test_resume_truncates_jsonl(tmp_path):
  _write_steps(tmp_path, range(1, 11), scale=1.0)
  _write_steps(tmp_path, range(6, 9), scale=-1.0, resume_step=5)
  records = read_metrics(tmp_path)
  assert [r["step"] for r in records] == list(range(1, 9))
  assert [r["train/loss"] for r in records] == [1.0, 2.0, 3.0, 4.0, 5.0, -6.0, -7.0, -8.0]
  assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl", "tensorboard"]  # No temp file.


def test_resume_purges_tensorboard(tmp_path):
  _write_steps(tmp_path, range(1, 11), scale=1.0)
  _write_steps(tmp_path, range(6, 9), scale=-1.0, resume_step=5)
  assert len(os.listdir(tmp_path / "tensorboard")) == 2  # The first file survives.
  for tag, curve in _scalars(tmp_path).items():
    assert [s for s, _ in curve] == list(range(1, 9)), tag
  expected = [1.0, 2.0, 3.0, 4.0, 5.0, -6.0, -7.0, -8.0]
  assert [v for _, v in _scalars(tmp_path)["train/loss"]] == expected
  # This loader ignores the first START of a run, so the fresh writer must write one too.
  plugin = _plugin_scalars(tmp_path)
  assert set(plugin) == {"train/loss", "lr"}
  assert plugin["train/loss"] == list(zip(range(1, 9), expected))


def test_without_resume_step_tensorboard_keeps_orphans(tmp_path):
  # The control for the test above: the purge is what hides steps 9 and 10.
  _write_steps(tmp_path, range(1, 11), scale=1.0)
  _write_steps(tmp_path, range(6, 9), scale=-1.0)
  steps = [s for s, _ in _scalars(tmp_path)["train/loss"]]
  assert 10 in steps and len(steps) == 13
  assert len(_plugin_scalars(tmp_path)["train/loss"]) == 13
  assert len(read_metrics(tmp_path)) == 13


def test_torn_last_line_is_dropped_then_repaired(tmp_path, caplog):
  _write_steps(tmp_path, [1, 2, 3], scale=1.0, tensorboard=False)
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write('{"step": 4, "train/lo')  # A crash in the middle of a write.
  with caplog.at_level(logging.WARNING):
    records = read_metrics(tmp_path)
  assert [r["step"] for r in records] == [1, 2, 3]
  assert "incomplete last line" in caplog.text

  _write_steps(tmp_path, [4], scale=1.0, tensorboard=False)  # Appends after the repair.
  assert "dropping an incomplete last line" in caplog.text
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    records = read_metrics(tmp_path)
  assert [r["step"] for r in records] == [1, 2, 3, 4]
  assert "incomplete" not in caplog.text


def test_last_line_without_newline_is_kept(tmp_path):
  (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.0}')
  assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
  _write_steps(tmp_path, [3], scale=1.0, tensorboard=False)
  assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]


def test_corrupt_middle_line_names_file_and_line(tmp_path):
  (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": oops}\n{"step": 3}\n')
  with pytest.raises(MochegInputError, match=r"metrics\.jsonl:2:"):
    read_metrics(tmp_path)


def test_missing_metrics_file(tmp_path):
  with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
    read_metrics(tmp_path)


def test_disabled_writer_writes_nothing(tmp_path):
  workdir = tmp_path / "run"
  with MetricWriter(workdir, enabled=False, resume_step=3) as w:
    w.write(1, {"loss": jnp.float32(1.0)})
    w.flush()
    with pytest.raises(ValueError, match='"step"'):  # Still checked on every process.
      w.write(2, {"step": 1})
  assert not workdir.exists()


def test_only_process_zero_writes_by_default(tmp_path, monkeypatch):
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  with MetricWriter(tmp_path / "a") as w:
    w.write(1, {"loss": 1.0})
  assert not (tmp_path / "a").exists()
  monkeypatch.setattr(jax, "process_index", lambda: 0)
  with MetricWriter(tmp_path / "b", tensorboard=False) as w:
    w.write(1, {"loss": 1.0})
  assert read_metrics(tmp_path / "b") == [{"step": 1, "loss": 1.0}]


@pytest.mark.parametrize("metrics, error, match", [
    ({"step": 1.0}, ValueError, '"step"'),
    ({3: 1.0}, TypeError, "must be strings"),
    ({"acc": jnp.ones(3)}, ValueError, "'acc'.*shape \\(3,\\)"),
    ({"acc": np.ones((1,))}, ValueError, "'acc'.*shape \\(1,\\)"),
    ({"name": "bert"}, TypeError, "'name'"),
    ({"z": np.complex64(1j)}, TypeError, "'z'.*complex"),
    ({"none": None}, TypeError, "'none'"),
])
def test_bad_metrics_are_rejected(tmp_path, metrics, error, match):
  with MetricWriter(tmp_path, tensorboard=False) as w:
    with pytest.raises(error, match=match):
      w.write(1, metrics)
  assert (tmp_path / "metrics.jsonl").read_text() == ""  # Nothing half-written.


def test_bad_step_and_closed_writer(tmp_path):
  w = MetricWriter(tmp_path, tensorboard=False)
  with pytest.raises(TypeError, match="step"):
    w.write(1.5, {"loss": 1.0})
  with pytest.raises(ValueError, match="step"):
    w.write(-1, {"loss": 1.0})
  w.close()
  w.close()  # Idempotent.
  with pytest.raises(RuntimeError, match="closed"):
    w.write(1, {"loss": 1.0})


def test_event_file_names_sort_in_time_order(tmp_path):
  # Two writers in the same second must neither overwrite each other's event file nor
  # sort out of order (TensorBoard reads files in name order).
  for _ in range(3):
    _write_steps(tmp_path, [1], scale=1.0)
  names = os.listdir(tmp_path / "tensorboard")
  assert len(names) == 3
  mtimes = [os.stat(tmp_path / "tensorboard" / n).st_mtime_ns for n in sorted(names)]
  assert mtimes == sorted(mtimes)
  assert writer_lib.TENSORBOARD_DIR == "tensorboard"


def test_sigkill_loses_no_written_line(tmp_path):
  # Without the flush after each line, these records would still sit in the buffer of
  # the killed process.
  code = f"""
import os, signal
from mocheg_jax.train.writer import MetricWriter
w = MetricWriter({str(tmp_path)!r}, tensorboard=False)
for step in range(1, 4):
  w.write(step, {{"loss": 1.0 / step}})
os.kill(os.getpid(), signal.SIGKILL)
"""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                        timeout=120, cwd=os.path.dirname(os.path.dirname(__file__)))
  assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
  assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
