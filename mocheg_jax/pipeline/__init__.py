"""The fact-checking pipeline as a library: its manifest, the fact-checker, the report."""
