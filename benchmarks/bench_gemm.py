r"""Float32 matrix products on CPU: XLA's, as our models call them, against PyTorch's.

  python benchmarks/bench_gemm.py [--shapes=bart_ffn_in,... --repeats=5 --calls=10 \
      --threads=2]

Why: the suite's training and encoding steps are mostly matrix products, so their ratios
are mostly the ratio of the two sides' GEMM kernels, and that depends on the CPU. On an AMD
EPYC (AVX2) XLA:CPU's kernels (YNNPACK) were on par with PyTorch's; on an Intel Xeon with
AVX-512 PyTorch's (oneDNN / MKL) ran 15-30% faster, and most training ratios fell below
1.0x with them (BENCHMARKS.md, "A second CPU"). This benchmark measures that directly, on
the products of the benchmarked models, so that a suite run says whether a missed ratio is
the kernels'.

Each shape is timed two ways:
- forward, x [M, K] @ w [K, N]: ours `models.matmul.matmul` under jax.jit (what a dense
  layer runs on CPU), PyTorch `x @ w`;
- weight gradient, x^T g for g [M, N]: ours the pullback of `matmul.matmul` with respect to
  w (what training runs: matmul.py's canonical dots with a transposed operand), PyTorch
  `x.T @ g` (what autograd runs for a linear layer's weight), and the plain dot_general
  contracting both operands' rows (the dot matmul.py replaces on CPU: its column says
  whether the replacement pays on this CPU).
Every side gets the same float32 inputs; their outputs are compared with PyTorch's (largest
difference relative to the largest magnitude). Timing: one warm-up run per side
(compilation), then --repeats rounds, the sides in turn, each round --calls products (ours
looped inside one jitted program: _sides says why); the best round counts. GFLOP/s =
2 M K N / time; ratio = ours / PyTorch GFLOP/s. The summary is the geometric mean of the
ratios (no target of its own: it explains the others). torch runs with
torch.set_num_threads(--threads); XLA's CPU client uses every CPU. Prints a table and
writes JSON to --out. Not a test.
"""

from __future__ import annotations

if __name__ == "__main__":  # First: a re-exec keeps nothing done before it.
  from mocheg_jax.utils import allocator
  allocator.run_under_preferred_allocator()

import json
import os
import platform
import statistics
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:  # `python benchmarks/bench_gemm.py` from anywhere.
  sys.path.insert(0, _REPO)

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # noqa: E402

# name: (what it is, M, K, N). Rows M: tokens of a batch as the benchmarks run them.
SHAPES = {
    "bart_ffn_in": ("BART base FFN in, 8 x 128 tokens", 1024, 768, 3072),
    "bart_ffn_out": ("BART base FFN out, 8 x 128 tokens", 1024, 3072, 768),
    "minilm_ffn_in": ("MiniLM FFN in, 64 x 128 tokens", 8192, 384, 1536),
    "minilm_projection": ("MiniLM attention projection, 64 x 40 tokens", 2560, 384, 384),
    "clip_small_ffn_in": ("small CLIP FFN in, 64 images x 65 patches", 4160, 64, 128),
    "decode_ffn_in": ("BART base FFN in, one decoding step of 8 rows", 8, 768, 3072),
    "tiny": ("a tiny product (smoke runs)", 16, 32, 24),
}
DEFAULT_SHAPES = [name for name in SHAPES if name != "tiny"]
KINDS = ("forward", "weight_gradient")

_SHAPES = flags.DEFINE_list("shapes", DEFAULT_SHAPES, f"Products to time, from {sorted(SHAPES)}.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed rounds per side (interleaved).")
_CALLS = flags.DEFINE_integer("calls", 20, "Products per round.")
_THREADS = flags.DEFINE_integer("threads", 2, "torch threads.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the inputs.")
_OUT = flags.DEFINE_string("out", "benchmarks/out/gemm.json", "JSON output path.")


def _sides(kind: str, m: int, k: int, n: int, rng):
  """{"ours", "reference"[, "plain"]}: callables that run the product --calls times and
  return the sum of the results; "plain" (weight gradients only) is x^T g as one
  dot_general contracting both operands' rows, the dot matmul.py's transposes replace on
  CPU, so a run shows whether that choice still pays on this CPU. Ours (and plain) is one
  jitted program looping inside XLA (lax.fori_loop), so the time is the kernels' and not
  Python's dispatch per call (which, for the sub-millisecond products, moved a back-to-back
  run of jitted calls between 0.6x and 1.03x of PyTorch from run to run); each iteration
  scales x by a factor the compiler cannot prove to be 1, so the product is not hoisted out
  of the loop. PyTorch's CPU calls cost a few microseconds each in Python."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  import torch

  from mocheg_jax.models import matmul

  x = rng.standard_normal((m, k), dtype=np.float32)
  w = rng.standard_normal((k, n), dtype=np.float32)
  g = rng.standard_normal((m, n), dtype=np.float32)
  jx, jw, jg = (jax.device_put(a) for a in (x, w, g))
  tx, tw, tg = (torch.from_numpy(a.copy()) for a in (x, w, g))
  calls = _CALLS.value

  def forward(x, w, g):
    return matmul.matmul(x, w)

  def weight_gradient(x, w, g):
    _, pullback = jax.vjp(lambda w: matmul.matmul(x, w), w)
    return pullback(g)[0]  # x^T g.

  def plain_weight_gradient(x, w, g):
    return jax.lax.dot_general(x, g, (((0,), (0,)), ((), ())))

  def looped(product):
    @jax.jit
    def run(x, w, g):
      def body(i, total):
        scale = 1.0 + i.astype(jnp.float32) * 1e-30  # 1.0 in float32, unknown when compiling.
        return total + product(x * scale, w, g)
      shape = (m, n) if kind == "forward" else (k, n)
      return jax.lax.fori_loop(0, calls, body, jnp.zeros(shape, jnp.float32))
    return lambda: run(jx, jw, jg).block_until_ready()

  def reference():
    total = torch.zeros((m, n) if kind == "forward" else (k, n))
    for _ in range(calls):
      total += tx @ tw if kind == "forward" else tx.T @ tg
    return total

  if kind == "forward":
    return dict(ours=looped(forward), reference=reference)
  return dict(ours=looped(weight_gradient), reference=reference,
              plain=looped(plain_weight_gradient))


def _round(fn) -> float:
  """Seconds per product of one run of `fn` (--calls products)."""
  start = time.perf_counter()
  fn()
  return (time.perf_counter() - start) / _CALLS.value


def bench_shape(name: str, kind: str, rng) -> dict:
  import numpy as np

  label, m, k, n = SHAPES[name]
  sides = _sides(kind, m, k, n, rng)
  start = time.perf_counter()
  ours_out = np.asarray(sides["ours"]())  # Compiles. All return the sum of --calls products.
  compile_s = time.perf_counter() - start
  ref_out = sides["reference"]().numpy()
  scale = float(np.abs(ref_out).max()) or 1.0
  outputs = [ours_out] + ([np.asarray(sides["plain"]())] if "plain" in sides else [])
  difference = max(float(np.abs(out - ref_out).max()) / scale for out in outputs)
  seconds = {side: [] for side in sides}
  for _ in range(_REPEATS.value):  # Interleaved, so load changes hit every side alike.
    for side, fn in sides.items():
      seconds[side].append(_round(fn))
  flops = 2.0 * m * k * n
  gflops = {side: flops / min(s) / 1e9 for side, s in seconds.items()}
  row = dict(shape=name, label=label, kind=kind, m=m, k=k, n=n,
             ours_seconds=seconds["ours"], reference_seconds=seconds["reference"],
             ours_gflops=gflops["ours"], reference_gflops=gflops["reference"],
             ratio=gflops["ours"] / gflops["reference"], max_relative_difference=difference,
             ours_compile_s=compile_s, plain_seconds=None, plain_gflops=None, plain_ratio=None)
  if "plain" in sides:
    row.update(plain_seconds=seconds["plain"], plain_gflops=gflops["plain"],
               plain_ratio=gflops["plain"] / gflops["reference"])
  return row


def main(argv: list[str]) -> None:
  del argv
  import numpy as np
  import torch

  unknown = sorted(set(_SHAPES.value) - set(SHAPES))
  if unknown:
    raise app.UsageError(f"--shapes: unknown {unknown}; use {', '.join(SHAPES)}")
  torch.set_num_threads(_THREADS.value)
  rng = np.random.default_rng(_SEED.value)
  rows = [bench_shape(name, kind, rng) for name in _SHAPES.value for kind in KINDS]
  mean = statistics.geometric_mean
  summary = dict(ours_gflops=mean([r["ours_gflops"] for r in rows]),
                 reference_gflops=mean([r["reference_gflops"] for r in rows]),
                 ratio=mean([r["ratio"] for r in rows]),
                 max_relative_difference=max(r["max_relative_difference"] for r in rows))
  print(f"float32 matrix products, best of {_REPEATS.value} interleaved rounds of "
        f"{_CALLS.value} products; {_THREADS.value} torch threads; XLA cpu on {os.cpu_count()} "
        "CPUs")
  print("| product | M x K x N | kind | ours GFLOP/s | PyTorch GFLOP/s | ratio "
        "| plain dot's ratio | max rel. diff |")
  print("|---|---|---|---|---|---|---|---|")
  for r in rows:
    plain = "-" if r["plain_ratio"] is None else f"{r['plain_ratio']:.3f}x"
    print(f"| {r['label']} | {r['m']} x {r['k']} x {r['n']} | {r['kind'].replace('_', ' ')} "
          f"| {r['ours_gflops']:.1f} | {r['reference_gflops']:.1f} | {r['ratio']:.3f}x "
          f"| {plain} | {r['max_relative_difference']:.1e} |")
  print(f"geometric mean of the ratios: {summary['ratio']:.3f}x")
  result = dict(benchmark="gemm", platform=platform.platform(), cpu_count=os.cpu_count(),
                torch_threads=_THREADS.value, repeats=_REPEATS.value, calls=_CALLS.value,
                shapes=rows, summary=summary)
  os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
  with open(_OUT.value, "w") as f:
    json.dump(result, f, indent=2)
  print(f"-> {_OUT.value}")


if __name__ == "__main__":
  app.run(main)
