"""The shared trainer: optimizer, train state, jitted step, loop, checkpoints and metrics."""
