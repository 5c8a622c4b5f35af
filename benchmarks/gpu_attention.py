"""Attention kernels on an accelerator: ours (layers.dot_product_attention) against JAX's.

  python benchmarks/gpu_attention.py [--out=benchmarks/out/gpu_attention.json]
  python benchmarks/gpu_attention.py --smoke    # tiny shapes, XLA variants only, any backend

Times forward + backward (the gradient of <out, cotangent> w.r.t. q, k and v) in bfloat16
at the shapes the training steps of benchmarks/gpu_train.py run, for:
* ours: mocheg_jax.models.layers.dot_product_attention (XLA: two batched matmuls, float32
  logits and softmax);
* xla: jax.nn.dot_product_attention(implementation="xla");
* ours_cudnn: layers.cudnn_attention, what $MOCHEG_JAX_ATTENTION=cudnn runs (our mask
  broadcast to full query x key size);
* cudnn_mask: implementation="cudnn" with our boolean mask as it is ([B, 1, 1, K] padding);
* cudnn_lengths: implementation="cudnn" with per-row key lengths (and is_causal) in place
  of the mask: the same attention when padding is on the right, as our batches pad.
Each variant's output and gradients are compared with ours (max abs difference). A variant
that fails (unsupported shape, no cuDNN) is recorded with its error; the others still run.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:  # `python benchmarks/gpu_attention.py` from anywhere.
  sys.path.insert(0, _REPO)

from absl import app, flags  # noqa: E402

from benchmarks import timing  # noqa: E402

_REPEATS = flags.DEFINE_integer("repeats", 20, "Timed calls per variant (best is kept).")
_SMOKE = flags.DEFINE_bool("smoke", False, "Tiny shapes, XLA variants only (any backend).")
_OUT = flags.DEFINE_string("out", "benchmarks/out/gpu_attention.json", "JSON output path.")

# (name, batch, length, heads, head_dim, causal): the attention calls of gpu_train's steps.
SHAPES = (
    ("bart_encoder", 32, 512, 16, 64, False),
    ("bart_decoder_self", 32, 256, 16, 64, True),
    ("minilm_document", 512, 128, 12, 32, False),
    ("clip_vision", 480, 50, 12, 64, False),
    ("clip_text", 480, 77, 8, 64, True),
)


def _inputs(batch: int, length: int, heads: int, dim: int, causal: bool, seed: int = 0):
  import jax
  import jax.numpy as jnp
  import numpy as np
  keys = jax.random.split(jax.random.key(seed), 4)
  q, k, v, g = (jax.random.normal(key, (batch, length, heads, dim), jnp.bfloat16)
                for key in keys)
  # Right padding: every row keeps between half and all of its tokens.
  lengths = np.random.default_rng(seed).integers(length // 2, length + 1, batch)
  lengths = jnp.asarray(lengths, jnp.int32)
  keep = jnp.arange(length)[None, :] < lengths[:, None]  # [B, K]
  mask = keep[:, None, None, :]
  if causal:
    mask = mask & jnp.tril(jnp.ones((length, length), bool))[None, None]
  return q, k, v, g, mask, lengths


def variants(smoke: bool):
  import jax

  from mocheg_jax.models import layers

  out = {"ours": lambda q, k, v, mask, lengths, causal: layers.dot_product_attention(
      q, k, v, mask=mask),
         "xla": lambda q, k, v, mask, lengths, causal: jax.nn.dot_product_attention(
             q, k, v, mask=mask, implementation="xla")}
  if not smoke:
    # What $MOCHEG_JAX_ATTENTION=cudnn runs: the mask broadcast to full size; None where
    # cuDNN refuses (the model then takes the XLA path).
    out["ours_cudnn"] = lambda q, k, v, mask, lengths, causal: _refused_if_none(
        layers.cudnn_attention(q, k, v, mask))
    out["cudnn_mask"] = lambda q, k, v, mask, lengths, causal: jax.nn.dot_product_attention(
        q, k, v, mask=mask, implementation="cudnn")
    out["cudnn_lengths"] = lambda q, k, v, mask, lengths, causal: (
        jax.nn.dot_product_attention(q, k, v, is_causal=causal, query_seq_lengths=lengths,
                                     key_value_seq_lengths=lengths, implementation="cudnn"))
  return out


def _refused_if_none(out):
  if out is None:
    raise NotImplementedError("layers.cudnn_attention refused: the XLA path would run")
  return out


def main(argv):
  del argv
  import jax
  import jax.numpy as jnp

  smoke = _SMOKE.value
  shapes = [(n, 2, 16, 2, 8, c) for n, *_, c in SHAPES[:2]] if smoke else SHAPES
  results = []
  for name, b, length, h, d, causal in shapes:
    q, k, v, g, mask, lengths = _inputs(b, length, h, d, causal)
    # Padded query rows differ between the variants (masked vs zero): compare real rows.
    real = (jnp.arange(length)[None, :] < lengths[:, None])[:, :, None, None]
    reference = None
    for variant, attend in variants(smoke).items():
      def loss(q, k, v, attend=attend):
        out = attend(q, k, v, mask, lengths, causal)
        return jnp.sum(jnp.where(real, out, 0).astype(jnp.float32) * g), out

      step = jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))
      row = dict(shape=name, variant=variant, batch=b, length=length, heads=h, head_dim=d,
                 causal=causal)
      try:
        seconds = timing.best_time(step, q, k, v, repeats=_REPEATS.value)
        grads, out = step(q, k, v)
        values = [jnp.where(real, out, 0), *grads]
        if reference is None:
          reference = values
        row.update(ms=seconds * 1e3, max_abs_diff=max(
            float(jnp.max(jnp.abs(a.astype(jnp.float32) - r.astype(jnp.float32))))
            for a, r in zip(values, reference)))
      except Exception as e:  # noqa: BLE001  (an unsupported variant is a finding)
        traceback.print_exc(limit=2)
        row.update(ms=None, error=f"{type(e).__name__}: {str(e)[:300]}")
      results.append(row)

  print(f"backend {jax.default_backend()}, {jax.devices()[0].device_kind}, jax "
        f"{jax.__version__}; forward + backward, bfloat16")
  print("| shape | variant | ms | vs ours | max abs diff |\n|---|---|---|---|---|")
  ours = {r["shape"]: r["ms"] for r in results if r["variant"] == "ours"}
  for r in results:
    if r["ms"] is None:
      print(f"| {r['shape']} | {r['variant']} | failed | - | {r['error'][:80]} |")
      continue
    ratio = f"{ours[r['shape']] / r['ms']:.2f}x" if ours.get(r["shape"]) else "-"
    print(f"| {r['shape']} | {r['variant']} | {r['ms']:.3f} | {ratio} | "
          f"{r['max_abs_diff']:.3g} |")
  os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
  with open(_OUT.value, "w") as f:
    json.dump(dict(benchmark="gpu_attention", backend=jax.default_backend(),
                   device_kind=jax.devices()[0].device_kind, jax_version=jax.__version__,
                   smoke=smoke, results=results), f, indent=2)
  print(f"wrote {_OUT.value}")
  if smoke and any(r["ms"] is None for r in results):
    raise SystemExit("error: an XLA variant failed in the smoke run")


if __name__ == "__main__":
  app.run(main)
