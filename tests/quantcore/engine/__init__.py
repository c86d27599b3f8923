"""Tests of quantcore.engine (stage 7, build engine)."""
