"""Tests of quantcore.tensorrt.engine (stage 7, build engine)."""
