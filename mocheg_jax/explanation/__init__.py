"""Explanation generation: BART with the classifier reward, its baselines and Table 5."""
