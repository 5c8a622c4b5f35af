"""mocheg-jax: end-to-end multimodal fact-checking with explanations in JAX/Flax."""

__version__ = "0.1.0"
