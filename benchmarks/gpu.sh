#!/usr/bin/env bash
# Accelerator figures for the model zoo in a few minutes: run from the repository root on a
# CUDA machine whose environment already has jax with CUDA support and this package
# (`pip install -e .`). Installs nothing; fails loudly if JAX sees no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -c 'import jax, sys; b = jax.default_backend(); sys.exit(0 if b in ("gpu", "cuda", "rocm") else f"error: JAX backend is {b!r}, not a GPU")'
OUT=${OUT:-benchmarks/out}
mkdir -p "$OUT"
"$PY" benchmarks/gpu_models.py --dtype=bfloat16 --out="$OUT/gpu_models_bf16.json"
"$PY" benchmarks/gpu_models.py --dtype=float32 --repeats=3 --out="$OUT/gpu_models_f32.json"
# Exact top-10 search, 2,442 x 2,792,639 x 384, float32 and bfloat16 (~1 min on an H100/H200).
"$PY" benchmarks/gpu_search.py --repeats=10 --out="$OUT/gpu_search.json"
