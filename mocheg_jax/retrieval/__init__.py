"""Evidence retrieval: BM25 and dense retrievers, corpus search, results and Table 3 evaluation."""
