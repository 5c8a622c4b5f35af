"""The one train step: `train_step(state, batch, rng) -> (state, metrics)`, pure and jitted once.

Inside: the step's key is `fold_in(rng, step)`, so the randomness of step s does not depend
on how the run got there (a resumed run repeats it exactly); gradient accumulation runs the
micro-batches in a `lax.scan`; a NaN/Inf loss or gradient skips the update and records the
step, which the loop reports at its next host sync (log or checkpoint steps only). With
`ema_decay` the state's moving average of the parameters follows each good update.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import optax

from mocheg_jax.train.state import ModelSpec
from mocheg_jax.train.state import TrainState
from mocheg_jax.train.task import Batch
from mocheg_jax.train.task import Metrics

LossFn = Callable[..., tuple[jax.Array, Metrics]]


def split_micro_batches(batch: Batch, accum_steps: int) -> Batch:
  """[B, ...] -> [accum_steps, B / accum_steps, ...], micro-batch i = rows i::accum_steps.

  Strided rather than contiguous: the batch is sharded in contiguous row blocks, so a
  contiguous micro-batch would sit on a fraction of the devices while the rest idled.
  """
  def split(x):
    b = x.shape[0]
    return x.reshape(b // accum_steps, accum_steps, *x.shape[1:]).swapaxes(0, 1)
  return jax.tree.map(split, batch)


def moving_average_decay(ema_decay: float, step: jax.Array) -> jax.Array:
  """The decay of the update made at `step` (0-based): min(ema_decay, step / (step + 10)).

  0 at step 0, so the average starts at the first updated parameters (not at the zeros it
  is initialised with, nor at the random or pretrained start); the ramp (TensorFlow's
  ExponentialMovingAverage with num_updates, one step later) keeps the first steps'
  parameters from weighing on a short run's average: at step 100 it spans ~11 steps.
  """
  t = jnp.asarray(step, jnp.float32)
  return jnp.minimum(jnp.float32(ema_decay), t / (t + 10.0))


def make_train_step(spec: ModelSpec, loss_fn: LossFn, tx: optax.GradientTransformation,
                    schedule: optax.Schedule, accum_steps: int = 1,
                    constrain_micro: Callable[[Batch], Batch] = lambda b: b,
                    with_constants: bool = False, ema_decay: float = 0.0
                    ) -> Callable[..., tuple[TrainState, Metrics]]:
  """The step function (not yet jitted; the loop jits it with shardings and donation).

  Args:
    spec: rebuilds the model from the state's dicts.
    loss_fn: the task's `loss(model, batch) -> (loss, metrics)`, or with `with_constants`
      `loss(model, batch, constants)` (Task.constants: the step's fourth argument).
    tx, schedule: the optimizer and its learning-rate schedule (logged).
    accum_steps: micro-batches per step.
    constrain_micro: re-applies the batch sharding to a micro-batch.
    ema_decay: > 0: the state's `ema` (initialised by state.py) follows the parameters
      with the decay `moving_average_decay(ema_decay, step)`.
  """

  def micro_loss(params, frozen, others, micro, key, constants):
    model = spec.merge(params, frozen, others, key)
    loss, metrics = (loss_fn(model, micro, constants) if with_constants
                     else loss_fn(model, micro))
    return loss.astype(jnp.float32), {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}

  grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

  def gradients(state: TrainState, batch: Batch, key: jax.Array, constants):
    if accum_steps == 1:
      return grad_fn(state.params, state.frozen, state.others, batch, key, constants)
    micro_batches = split_micro_batches(batch, accum_steps)

    def body(carry, xs):
      micro, index = xs
      out = grad_fn(state.params, state.frozen, state.others, constrain_micro(micro),
                    jax.random.fold_in(key, index), constants)
      return jax.tree.map(jnp.add, carry, out), None

    first = jax.tree.map(lambda x: x[0], micro_batches)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                         jax.eval_shape(grad_fn, state.params, state.frozen, state.others,
                                        first, key, constants))
    total, _ = jax.lax.scan(body, zeros, (micro_batches, jnp.arange(accum_steps)))
    return jax.tree.map(lambda x: x / accum_steps, total)

  def train_step(state: TrainState, batch: Batch, rng: jax.Array, constants: Any = None
                 ) -> tuple[TrainState, Mapping[str, jax.Array]]:
    key = jax.random.fold_in(rng, state.step)
    (loss, metrics), grads = gradients(state, batch, key, constants)
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

    def update(operands):
      params, opt_state, ema = operands
      updates, opt_state = tx.update(grads, opt_state, params)
      params = optax.apply_updates(params, updates)
      if ema_decay:
        d = moving_average_decay(ema_decay, state.step)
        ema = jax.tree.map(lambda e, p: (d * e + (1.0 - d) * p).astype(p.dtype), ema, params)
      return params, opt_state, ema

    params, opt_state, ema = jax.lax.cond(finite, update, lambda operands: operands,
                                          (state.params, state.opt_state, state.ema))
    first_bad = jnp.where((state.first_nonfinite_step < 0) & ~finite, state.step,
                          state.first_nonfinite_step)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                              first_nonfinite_step=first_bad, ema=ema)
    out = {"loss": loss, "grad_norm": grad_norm, "learning_rate": schedule(state.step),
           **metrics}
    return new_state, out

  return train_step
