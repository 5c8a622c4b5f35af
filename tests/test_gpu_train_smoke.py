"""benchmarks/gpu_train.py, gpu_attention.py and profile_summary.py in smoke mode on CPU.

Subprocesses, as for gpu_search: the scripts define absl flags at import. Single-device
(XLA_FLAGS: conftest's 8 fake devices cleared, XLA's costly passes off as in every script
test): the scripts time one device's step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks import profile_summary
from tests.processes import FAST_COMPILE_FLAGS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURES = ("bart_large_nll", "clip_vitb32_contrastive", "minilm_infonce")


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO, XLA_FLAGS=FAST_COMPILE_FLAGS)
  return subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", script), *args],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
                        check=False)


@pytest.fixture(scope="module")
def train_smoke(tmp_path_factory):
  out = tmp_path_factory.mktemp("gpu_train")
  proc = _run("gpu_train.py", "--smoke", "--repeats=2", "--profile_steps=2",
              "--peak_tflops=1", f"--profile_dir={out}", f"--out={out / 'smoke.json'}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads((out / "smoke.json").read_text()), proc.stdout, out


def test_train_smoke_figures(train_smoke):
  result, stdout, out = train_smoke
  assert result["smoke"] is True and result["backend"] == "cpu" and result["failures"] == []
  assert result["peak_tflops_per_device"] == 1.0 and "--peak_tflops" in result["peak_source"]
  assert result["settings"]["attention"] == "xla"  # The default; gpu_ab.sh varies it.
  assert [r["figure"] for r in result["results"]] == list(FIGURES)
  for r in result["results"]:
    assert 0 < r["best_s"] <= r["median_s"] and r["compile_s"] > 0
    assert r["parameters"] > 0 and r["model_flops"] > 0 and r["xla_flops"] > 0
    assert r["model_tflops_per_s"] == pytest.approx(r["model_flops"] / r["median_s"] / 1e12)
    assert r["mfu"] == pytest.approx(r["model_flops"] / r["median_s"] / 1e12)
    assert all(isinstance(v, float) for v in (r["first_loss"], r["last_loss"]))
    profile = r["profile"]
    assert os.path.exists(profile["path"]) and profile["steps"] == 2
    assert profile["kernel_ms_per_step"] > 0 and profile["top"]
    assert sum(k["share"] for k in profile["kinds"].values()) == pytest.approx(1.0)
    assert os.path.exists(out / f"{r['figure']}.hlo.txt.gz")
    # The costliest ops are named by their HLO instruction (shape, opcode, origin).
    assert any(row["hlo"] and "<- jit(" in row["hlo"] for row in profile["top"])
  assert "| bart_large_nll |" in stdout and "MFU" in stdout


def test_train_unknown_figure_is_refused(tmp_path):
  proc = _run("gpu_train.py", "--smoke", "--only=bart_large_nll,resnet", f"--out={tmp_path}/x")
  assert proc.returncode != 0 and "unknown figures ['resnet']" in proc.stderr


def test_profile_summary_of_a_cpu_trace(train_smoke):
  _, _, out = train_smoke
  rows = profile_summary.device_op_times(str(out / "minilm_infonce.xplane.pb.gz"))
  assert rows and all(r["count"] >= 1 and r["total_ms"] >= 0 for r in rows)
  assert [r["total_ms"] for r in rows] == sorted((r["total_ms"] for r in rows), reverse=True)


def test_profile_summary_kinds_and_shares():
  rows = [dict(op="command_buffer_1", kernel="nvjet_sm90_tst_128x128", count=4, total_ms=6.0),
          dict(op="fusion.3", kernel="loop_add_fusion", count=2, total_ms=3.0),
          dict(op="custom-call.1", kernel="cudnn_fmha_fwd", count=2, total_ms=1.0)]
  for r in rows:
    r["kind"] = profile_summary.kind_of(r["op"], r["kernel"])
  assert [r["kind"] for r in rows] == ["matmul", "other fusion", "attention"]
  summary = profile_summary.summarize(rows, steps=2, top=2)
  assert summary["kernel_ms_per_step"] == 5.0
  assert summary["kinds"]["matmul"] == dict(ms_per_step=3.0, share=0.6)
  assert [r["ms_per_step"] for r in summary["top"]] == [3.0, 1.5]
  assert "| 3.000 | 60.0% |" in profile_summary.table(summary)


def test_hlo_index_names_fusions_by_kernel():
  hlo = """
  %fusion.12 = bf16[32,16,512,512]{3,2,1,0} fusion(%p.1, %p.2), kind=kLoop, calls=%fc.3, metadata={op_name="jit(train_step)/jvp(Bart)/softmax" stack_frame_id=4}
  ROOT %custom-call.4 = (bf16[8,8]{1,0}, s8[64]{0}) custom-call(%a, %b), custom_call_target="__cublas$gemm"
"""
  index = profile_summary.hlo_index(hlo)
  assert index["fusion_12"] == ("bf16[32,16,512,512]{3,2,1,0} fusion(kLoop) <- "
                                "jit(train_step)/jvp(Bart)/softmax")
  assert index["custom_call_4"].endswith("custom-call")
  rows = profile_summary.annotate(
      [dict(op="command_buffer_1", kernel="fusion_12"), dict(op="custom-call.4", kernel="x"),
       dict(op="command_buffer_1", kernel="nvjet_sm90")], index)
  assert [r["hlo"] is not None for r in rows] == [True, True, False]


def test_attention_smoke(tmp_path):
  proc = _run("gpu_attention.py", "--smoke", "--repeats=1", f"--out={tmp_path / 'a.json'}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads((tmp_path / "a.json").read_text())
  rows = result["results"]
  assert {r["variant"] for r in rows} == {"ours", "xla"} and len(rows) == 4
  # JAX's XLA attention computes the same thing in bfloat16: a few bf16 ulps apart.
  assert all(r["ms"] > 0 and r["max_abs_diff"] < 0.05 for r in rows)


def test_ab_script_records_each_variant(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO, XLA_FLAGS=FAST_COMPILE_FLAGS,
             PYTHON=sys.executable, OUT=str(tmp_path), VARIANTS="cudnn/rbg")
  proc = subprocess.run(["bash", os.path.join(REPO, "benchmarks", "gpu_ab.sh"),
                         "minilm_infonce", "--smoke", "--repeats=1"], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads((tmp_path / "ab_cudnn_rbg.json").read_text())
  assert result["settings"] == dict(attention="cudnn", prng_impl="rbg",
                                    xla_flags=FAST_COMPILE_FLAGS)
  assert [r["figure"] for r in result["results"]] == ["minilm_infonce"]
  assert "| minilm_infonce | cudnn/rbg |" in proc.stdout and "| 1.000x |" in proc.stdout
