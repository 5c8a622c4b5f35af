"""Retrieval, classification and generation metrics, exactly as the Mocheg paper defines them."""
