"""Flax NNX models: BERT/MiniLM, CLIP and BART, with HF weight conversion.

Parameters carry logical axis names ("embed", "mlp", "heads", "kv", "vocab", ...) as
metadata; the mesh rules that map them to devices are config data (DESIGN.md). Eager
sharding is off: models are built abstractly and placed by a jitted init with
out_shardings, never on one device first.
"""

from flax import nnx

nnx.use_eager_sharding(False)
