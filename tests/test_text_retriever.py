"""The text retriever's training task: length buckets cut only padding."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from configs import retrieval_text as text_configs
from mocheg_jax.data import prepare
from mocheg_jax.retrieval import text_task
from mocheg_jax.train import state as state_lib


def test_length_buckets_leave_the_loss_and_gradients_alone(tmp_path):
  data_dir = str(tmp_path / "data")
  prepare.prepare(data_dir, scale="tiny", log=lambda _: None)
  config = text_configs.get_config("tiny")
  config.data.dir = data_dir
  config.model.dropout = 0.0  # Dropout masks depend on the shapes compared.
  config.retrieval.length_multiple = 8
  config.retrieval.max_query_len = 48  # tiny's 32 is what its longest claims fill.
  task = text_task.make_task(config, str(tmp_path / "text"))
  cut = next(iter(task.train_data(16)))
  r = config.retrieval
  widths = {"query": r.max_query_len, "positive": r.max_doc_len, "negative": r.max_doc_len}
  full = dict(cut)
  for name, width in widths.items():
    got = cut[f"{name}_ids"].shape[1]
    assert got % 8 == 0 and got < width, (name, got)  # Cut, so the comparison means something.
    for field in (f"{name}_ids", f"{name}_mask"):  # [PAD] is id 0, the mask 0.
      full[field] = np.pad(cut[field], ((0, 0), (0, width - got)))

  spec = state_lib.ModelSpec.of(task.model)
  params = nnx.to_pure_dict(nnx.state(task.model(), nnx.Param))

  @jax.jit
  def loss_and_grads(params, batch):
    return jax.value_and_grad(lambda p: task.loss(spec.merge(p, {}, {}, jax.random.key(0)),
                                                  batch), has_aux=True)(params)

  (loss_cut, _), grads_cut = loss_and_grads(params, cut)
  (loss_full, _), grads_full = loss_and_grads(params, full)
  np.testing.assert_allclose(loss_cut, loss_full, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               grads_cut, grads_full)
