"""Benchmarks and the accuracy harness (not part of the installed package)."""
