"""Bundled sample models for demos and tests."""
