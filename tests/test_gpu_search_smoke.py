"""benchmarks/gpu_search.py in --smoke mode on CPU (8 fake devices, from conftest's XLA_FLAGS).

Everything runs in subprocesses: the script defines absl flags at import, which must not
collide with other modules' flags in the pytest process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mocheg_jax.utils import peaks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "benchmarks", "gpu_search.py")


def _run(*args: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO)
  return subprocess.run([sys.executable, SCRIPT, *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
  out = tmp_path_factory.mktemp("gpu_search") / "smoke.json"
  proc = _run("--smoke", "--repeats=1", "--host_repeats=1", f"--out={out}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(out.read_text()), proc.stdout


def test_smoke_fields_and_check(smoke):
  result, stdout = smoke
  assert result["smoke"] is True and result["backend"] == "cpu"
  assert result["num_devices"] == 8 and result["mesh"] == "data=8 fsdp=1 tensor=1"
  # The smoke shapes cover several chunks with a padded last one and several query batches.
  assert result["chunks"] >= 2 and result["chunks"] * result["rows_per_device"] * 8 > \
      result["num_docs"]
  assert result["query_batches"] >= 2 and result["check_queries"] == result["num_queries"]
  assert [r["dtype"] for r in result["results"]] == ["float32", "bfloat16"]
  n, nq, d = result["num_docs"], result["num_queries"], result["dim"]
  for r, itemsize in zip(result["results"], (4, 2)):
    assert r["seconds"] > 0
    assert r["queries_per_s"] == pytest.approx(nq / r["seconds"])
    assert r["flops"] == 2 * nq * n * d
    assert r["tflops_per_s"] == pytest.approx(r["flops"] / r["seconds"] / 1e12)
    assert r["corpus_bytes"] == n * d * itemsize
    assert r["corpus_bytes_streamed"] > r["corpus_bytes"]
    check = r["check"]
    assert check["queries"] == nq and check["valid_distinct_ids"] is True
    # The public top_k from host memory finds exactly what the timed resident loop found.
    assert r["host_streamed"]["seconds"] > 0
    assert r["host_streamed"]["ids_equal_to_resident_rate"] == 1.0
  f32, bf16 = result["results"]
  assert f32["matmul_mode"] == "fp32" and bf16["matmul_mode"] == "bf16"
  assert f32["check"]["passed"] is True and f32["check"]["ids_equal_rate"] == 1.0
  assert f32["check"]["max_score_difference"] <= f32["check"]["score_tolerance"] < 1e-5
  assert bf16["check"]["passed"] is None and 0.5 < bf16["check"]["recall_at_k"] <= 1.0
  assert "| float32 | fp32 |" in stdout and "passed" in stdout


def test_unknown_device_gives_null_ratio(smoke):
  result, stdout = smoke
  for r in result["results"]:
    assert r["peak_tflops_per_device"] is None and r["hbm_gbps_per_device"] is None
    assert r["roofline_s"] is None and r["time_over_roofline"] is None
    assert r["roofline_fraction"] is None and r["time_over_floor"] is None
  assert len(result["notes"]) == 2 and "no table row for 'cpu'" in result["notes"][0]
  assert "note: float32: no roofline" in stdout and "| null |" in stdout


def test_overrides_give_the_roofline(tmp_path):
  out = tmp_path / "override.json"
  proc = _run("--smoke", "--repeats=1", "--host_streamed=false", "--check_queries=8",
              "--peak_tflops=bfloat16=0.001,float32=1", "--hbm_gbps=10", f"--out={out}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(out.read_text())
  devices = result["num_devices"]
  # float32 memory-bound, bfloat16 compute-bound: both terms of the roofline are checked.
  for r, tflops, bound in zip(result["results"], (1, 0.001), ("memory", "compute")):
    compute = r["flops"] / (tflops * 1e12 * devices)
    memory = r["corpus_bytes"] / (10e9 * devices)
    assert r["roofline_bound"] == bound
    assert r["roofline_s"] == pytest.approx(max(compute, memory))
    assert r["peak_tflops_per_device"] == tflops and r["hbm_gbps_per_device"] == 10
    assert r["time_over_roofline"] == pytest.approx(r["seconds"] / r["roofline_s"])
    assert r["roofline_fraction"] == pytest.approx(r["roofline_s"] / r["seconds"])
    moved = r["corpus_bytes_streamed"] + 2 * r["score_matrix_bytes"]
    assert r["floor_s"] == pytest.approx(max(compute, moved / (10e9 * devices)))
    assert r["host_streamed"] is None and r["check"]["queries"] == 8
  assert result["notes"] == []


def test_peak_table_and_modes():
  kinds = ["NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe",
           "NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe",
           "NVIDIA L4", "NVIDIA L40S", "NVIDIA GH200 480GB", "TPU v5 lite", "TPU v5", "cpu"]
  g = peaks
  got = dict(
      table={k: (e[0] if (e := g.peak_entry(k)) else None) for k in kinds},
      h200=list(g.peaks_for("NVIDIA H200", "bfloat16", "bf16", {}, None)),
      h200_f32=list(g.peaks_for("NVIDIA H200", "float32", g.matmul_mode("gpu", "float32", None),
                                {}, None)),
      tpu_high=list(g.peaks_for("TPU v4", "float32", g.matmul_mode("tpu", "float32", "high"),
                                {}, None)),
      modes=[g.matmul_mode("gpu", "float32", p) for p in (None, "highest", "bfloat16")]
      + [g.matmul_mode("gpu", "float32", None, "0"),
         g.matmul_mode("gpu", "float32", "F16_F16_F32")],
      override=g.parse_peak_override("500,bfloat16=900"))
  assert got["table"] == {
      "NVIDIA H200": "H200 SXM", "NVIDIA H200 NVL": "H200 NVL",
      "NVIDIA H100 80GB HBM3": "H100 SXM", "NVIDIA H100 PCIe": "H100 PCIe",
      "NVIDIA A100-SXM4-40GB": "A100 40GB", "NVIDIA A100-SXM4-80GB": "A100 80GB SXM",
      "NVIDIA A100 80GB PCIe": "A100 80GB PCIe", "NVIDIA L4": "L4", "NVIDIA L40S": None,
      "NVIDIA GH200 480GB": None, "TPU v5 lite": "TPU v5e", "TPU v5": "TPU v5p", "cpu": None}
  assert got["h200"][:2] == [989.4, 4800] and got["h200_f32"][:2] == [494.7, 4800]
  assert got["tpu_high"][:2] == [pytest.approx(275 / 3), 1200]
  assert got["modes"] == ["tf32", "fp32", "tf32", "fp32", None]
  assert got["override"] == {"float32": 500.0, "bfloat16": 900.0}
  assert g.bf16_peak_tflops("NVIDIA H200") == 989.4 and g.bf16_peak_tflops("cpu") is None
