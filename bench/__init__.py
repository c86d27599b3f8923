"""Benchmarks (not tests): ``python -m bench.quality``, see bench/README.md."""
