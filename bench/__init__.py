"""Benchmarks (not tests): each module here is an entry point, ``python -m bench.<name>``; what they share is in
``bench.models`` (models and their inputs) and ``bench.stats`` (significance)."""
