"""Reading, writing and feeding the Mocheg release layout."""
