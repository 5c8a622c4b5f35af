"""Weight conversion between our NNX models and HF (transformers) checkpoints, as data."""
