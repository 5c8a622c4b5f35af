"""Dense peak rates of accelerators by device kind, and the arithmetic a matmul runs in.

The trainer's MFU (train/loop.py) and the accelerator benchmarks (benchmarks/gpu_search.py,
gpu_train.py) divide by these. A device the table does not know gets None, never a
guessed figure.
"""

from __future__ import annotations

import math
import re

DTYPES = ("float32", "bfloat16")
ACCELERATORS = ("gpu", "cuda", "rocm", "tpu")

# Dense peaks per device: TFLOP/s by matmul input type and HBM GB/s. NVIDIA datasheets give
# tensor-core figures "with sparsity"; these are half of those (= the H100 whitepaper's
# dense table). fp32 is the non-tensor-core rate (what float32 at precision HIGHEST gets).
# TPUs: Cloud TPU system-architecture pages (bf16 only; float32 runs 1, 3 or 6 bf16 passes).
# Patterns are tried in order on the lowercased device_kind; "gh200" is deliberately unknown.
PEAKS: tuple[tuple[str, str, dict[str, float]], ...] = (
    (r"\bh200 nvl\b", "H200 NVL", dict(bf16=835.5, tf32=417.5, fp32=60.0, hbm=4800)),
    (r"\bh200\b", "H200 SXM", dict(bf16=989.4, tf32=494.7, fp32=66.9, hbm=4800)),
    (r"\bh100\b.*\bpcie\b", "H100 PCIe", dict(bf16=756.5, tf32=378.0, fp32=51.2, hbm=2039)),
    (r"\bh100\b.*\bnvl\b", "H100 NVL", dict(bf16=835.5, tf32=417.5, fp32=60.0, hbm=3900)),
    (r"\bh100\b", "H100 SXM", dict(bf16=989.4, tf32=494.7, fp32=66.9, hbm=3350)),
    (r"\ba100\b.*80gb.*pcie|\ba100\b.*pcie.*80gb", "A100 80GB PCIe",
     dict(bf16=312.0, tf32=156.0, fp32=19.5, hbm=1935)),
    (r"\ba100\b.*80gb", "A100 80GB SXM", dict(bf16=312.0, tf32=156.0, fp32=19.5, hbm=2039)),
    (r"\ba100\b", "A100 40GB", dict(bf16=312.0, tf32=156.0, fp32=19.5, hbm=1555)),
    (r"\bl4\b", "L4", dict(bf16=121.0, tf32=60.0, fp32=30.3, hbm=300)),
    (r"^tpu v4$", "TPU v4", dict(bf16=275.0, hbm=1200)),
    (r"^tpu v5 ?(lite|e)$", "TPU v5e", dict(bf16=197.0, hbm=819)),
    (r"^tpu v5p?$", "TPU v5p", dict(bf16=459.0, hbm=2765)),
)
def peak_entry(device_kind: str) -> tuple[str, dict[str, float]] | None:
  """(name, peaks) of the first table row matching `device_kind`, or None."""
  kind = device_kind.strip().lower()
  for pattern, name, entry in PEAKS:
    if re.search(pattern, kind):
      return name, entry
  return None


def matmul_mode(platform: str, dtype: str, precision: str | None,
                tf32_override: str | None = None) -> str | None:
  """The arithmetic a [Q, D] x [D, N] matmul of `dtype` inputs runs in, or None if unknown.

  Args:
    platform: "cpu", "gpu" or "tpu".
    dtype: "float32" or "bfloat16" (the inputs).
    precision: jax_default_matmul_precision (our search's dot sets no precision).
    tf32_override: $NVIDIA_TF32_OVERRIDE ("0" turns TF32 off in cuBLAS).
  """
  if dtype == "bfloat16":
    return "bf16"
  if platform == "cpu":
    return "fp32"
  fast = (None, "default", "bfloat16", "fastest")
  middle = ("high", "tensorfloat32", "bfloat16_3x")
  if platform == "gpu":
    if precision in ("highest", "float32", "F32_F32_F32") or tf32_override == "0":
      return "fp32"
    return "tf32" if precision in fast + middle + ("TF32_TF32_F32",) else None
  if platform == "tpu":
    modes = {p: "bf16" for p in fast + ("BF16_BF16_F32",)}
    modes.update({p: "bf16x3" for p in middle + ("BF16_BF16_F32_X3",)})
    modes.update({"highest": "bf16x6", "float32": "bf16x6", "BF16_BF16_F32_X6": "bf16x6"})
    return modes.get(precision)
  return None


def parse_peak_override(text: str | None) -> dict[str, float]:
  """--peak_tflops as {dtype: TFLOP/s}: '500' (every dtype) or 'bfloat16=989,float32=495'."""
  if not text:
    return {}
  out: dict[str, float] = {}
  for item in text.split(","):
    name, _, value = item.rpartition("=")
    names = [name.strip()] if name else list(DTYPES)
    if any(n not in DTYPES for n in names):
      raise ValueError(f"--peak_tflops: unknown dtype {name.strip()!r} in {text!r} "
                       f"(one of {', '.join(DTYPES)})")
    try:
      tflops = float(value)
    except ValueError:
      raise ValueError(f"--peak_tflops: {value.strip()!r} in {text!r} is not a number") from None
    if not tflops > 0 or math.isinf(tflops):
      raise ValueError(f"--peak_tflops: {tflops} in {text!r} must be positive and finite")
    out.update({n: tflops for n in names})
  return out


def peaks_for(device_kind: str, dtype: str, mode: str | None,
              override: dict[str, float], hbm_override: float | None
              ) -> tuple[float | None, float | None, str]:
  """(per-device peak TFLOP/s, per-device HBM GB/s, where they come from); None: unknown."""
  found = peak_entry(device_kind)
  name, entry = found if found else (None, {})
  tflops = override.get(dtype)
  if tflops is None and mode is not None:
    if mode in entry:
      tflops = entry[mode]
    elif mode in ("bf16x3", "bf16x6") and "tf32" not in entry and "bf16" in entry:
      tflops = entry["bf16"] / (3 if mode == "bf16x3" else 6)  # TPU multi-pass float32.
  gbps = hbm_override if hbm_override is not None else entry.get("hbm")
  source = ", ".join(filter(None, [
      f"table: {name}" if name else f"no table row for {device_kind!r}",
      "--peak_tflops" if dtype in override else None,
      "--hbm_gbps" if hbm_override is not None else None]))
  return tflops, gbps, source


def bf16_peak_tflops(device_kind: str) -> float | None:
  """The dense bfloat16 peak of one device (MFU's usual denominator), or None if unknown."""
  found = peak_entry(device_kind)
  return None if found is None else found[1].get("bf16")
