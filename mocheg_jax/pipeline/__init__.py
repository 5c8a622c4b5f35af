"""The fact-checking pipeline as a library: its manifest, the fact-checker, the report."""

from mocheg_jax.pipeline.fact_checker import FactCheck, FactChecker

__all__ = ["FactCheck", "FactChecker"]
