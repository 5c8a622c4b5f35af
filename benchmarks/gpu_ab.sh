#!/usr/bin/env bash
# Training-step variants side by side on one GPU, one process each (a setting changes the
# compiled program): `benchmarks/gpu_ab.sh [FIGURES [FLAGS...]]`, FIGURES a comma list of
# gpu_train.py's figures (default: BART-large and CLIP), FLAGS passed on to gpu_train.py
# (`--smoke` checks the script on a CPU). Each variant is
# "ATTENTION/PRNG": $MOCHEG_JAX_ATTENTION (xla | cudnn) and JAX_DEFAULT_PRNG_IMPL (the
# dropout masks' generator: threefry2x32 | rbg); VARIANTS overrides the list. Writes
# $OUT/ab_<attention>_<prng>.json and a table. About 2.5 minutes per variant on an H200
# for the default figures, most of it compilation. Installs nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-benchmarks/out}
FIGURES=${1:-bart_large_nll,clip_vitb32_contrastive}
shift $(($# > 0 ? 1 : 0))
VARIANTS=${VARIANTS:-"xla/threefry2x32 cudnn/threefry2x32 cudnn/rbg"}
mkdir -p "$OUT"
failed=()
for variant in $VARIANTS; do
  attention=${variant%/*} prng=${variant#*/}
  echo "== $variant"
  MOCHEG_JAX_ATTENTION=$attention JAX_DEFAULT_PRNG_IMPL=$prng "$PY" benchmarks/gpu_train.py \
    --only="$FIGURES" --repeats=5 --out="$OUT/ab_${attention}_${prng}.json" "$@" ||
    failed+=("$variant")
done
"$PY" - "$OUT" $VARIANTS <<'PYEOF'
import json, os, sys
out, variants = sys.argv[1], sys.argv[2:]
print("| figure | variant | median ms | MFU | vs first |\n|---|---|---|---|---|")
first = {}
for variant in variants:
  path = os.path.join(out, "ab_%s_%s.json" % tuple(variant.split("/")))
  if not os.path.exists(path):
    continue
  for r in json.load(open(path))["results"]:
    base = first.setdefault(r["figure"], r["median_s"])
    mfu = "-" if r["mfu"] is None else f"{r['mfu']:.1%}"
    print(f"| {r['figure']} | {variant} | {r['median_s'] * 1e3:.2f} | {mfu} | "
          f"{base / r['median_s']:.3f}x |")
PYEOF
if ((${#failed[@]})); then
  printf 'FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
