"""Claim verification: the stance-detection model (stance.py) and its baselines (baselines.py).

Labels follow mocheg_jax.data.labels: refuted = 0, supported = 1, NEI = 2.
"""
