#!/usr/bin/env bash
# Accelerator figures in a few minutes: run from the repository root on a CUDA machine whose
# environment already has jax with CUDA support and this package (`pip install -e .`, or the
# repository on PYTHONPATH). Installs nothing; fails loudly if JAX sees no GPU. Every part
# runs even when an earlier one fails; the exit status is non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -c 'import jax, sys; b = jax.default_backend(); sys.exit(0 if b in ("gpu", "cuda", "rocm") else f"error: JAX backend is {b!r}, not a GPU")' || exit 1
OUT=${OUT:-benchmarks/out}
mkdir -p "$OUT"
failed=()
part() {
  local start=$SECONDS
  echo "== $*"
  "$PY" "$@" || failed+=("$*")
  echo "== $(($SECONDS - start)) s: $1"
}
# Train steps (MFU): BART-large NLL, CLIP ViT-B/32 contrastive, MiniLM InfoNCE, bf16 compute.
part benchmarks/gpu_train.py --dtype=bfloat16 --out="$OUT/gpu_train_bf16.json"
# Exact top-10 search, 2,442 x 2,792,639 x 384, float32 and bfloat16 (~1 min on an H100/H200).
part benchmarks/gpu_search.py --repeats=10 --out="$OUT/gpu_search.json"
# Encoding throughput and BART-large greedy decoding at batch 1 and 64.
part benchmarks/gpu_models.py --dtype=bfloat16 --out="$OUT/gpu_models_bf16.json"
part benchmarks/gpu_models.py --dtype=float32 --repeats=3 --out="$OUT/gpu_models_f32.json"
if ((${#failed[@]})); then
  printf 'FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
