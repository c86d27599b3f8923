"""What the auto-strategy tests share: a small model and data (``small``), a Gemm whose weights a bit
decides, on a CPU without VNNI (``heavy_tailed``), the candidate runs as recorded
(``recorded_runs``), a progress callback that is the search's clock (``progress``), a config per candidate
list, and a stand-in for a worker's time-limit exception. The fixtures are registered by conftest.py."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import quantcore.config.auto
from quantcore import AnalysisOptions, AutoOptions, QuantizeConfig
from quantcore.auto import search as search_module
from quantcore.auto.search import Search
from quantcore.runtime import cpu_features
from tests.quantcore.models import conv_relu_gemm, save

NO_ANALYSIS = AnalysisOptions(enabled=False)


@pytest.fixture
def small(tmp_path):
    """A Conv-Relu-Gemm model, 40 calibration and 16 evaluation samples (every sample distinct)."""
    rng = np.random.default_rng(0)
    path = save(conv_relu_gemm(), tmp_path / "m.onnx")
    calibration = rng.normal(size=(40, 2, 6, 6)).astype(np.float32)
    evaluation = rng.normal(size=(16, 2, 6, 6)).astype(np.float32)
    return path, {"input": calibration}, {"input": evaluation}


@pytest.fixture
def heavy_tailed(tmp_path, monkeypatch):
    """On a CPU without VNNI (the flags stand in for one: the CPU is what a test cannot choose), where the config
    as given runs 7-bit weights: a Gemm each of whose output channels holds one weight 20 times its others'
    scale, so its grid step is about a third of a typical weight at 7 bits and a sixth at 8, far coarser than
    the activation grid of its Gaussian input: the weights' error rules, one bit halves it, and full int8
    weights are better beyond the paired interval, 7-bit ones still at cosine 0.999. Returns the model, 40
    calibration and 16 evaluation samples, and the ``reduce_range`` each candidate's run ran with (filled as
    they run)."""
    monkeypatch.setattr(cpu_features, "is_x86", lambda: True)
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    ranges: dict[str, str] = {}
    original = Search.run

    def run(self, config, name, should_cancel, report):
        ranges[name] = config.reduce_range
        return original(self, config, name, should_cancel, report)

    monkeypatch.setattr(Search, "run", run)
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(16, 64)).astype(np.float32)
    weight[np.arange(16), rng.integers(0, 64, 16)] = 20.0
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["input", "w"], ["output"], transB=1)],
        "heavy_tailed_gemm",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 16])],
        [numpy_helper.from_array(weight, "w")],
    )
    path = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    data = rng.normal(size=(56, 64)).astype(np.float32)
    return path, {"input": data[:40]}, {"input": data[40:]}, ranges


def auto_config(*candidates: str, **options) -> QuantizeConfig:
    auto = AutoOptions(candidates=candidates or None, **options)
    return QuantizeConfig(strategy="auto", analysis=NO_ANALYSIS, cpu_latency=False, auto=auto)


def rows(arrays) -> set[bytes]:
    """Each sample's bytes: the identity of a sample."""
    return {sample.tobytes() for sample in arrays["input"]}


@pytest.fixture
def recorded_runs(monkeypatch):
    """Every candidate run's (name, calibration, evaluation), in order, the runs themselves unchanged."""
    runs = []
    original = Search.run

    def run(self, config, name, should_cancel, report):
        runs.append((name, self.split.calibration, self.split.selection))
        return original(self, config, name, should_cancel, report)

    monkeypatch.setattr(Search, "run", run)
    return runs


@pytest.fixture
def progress(monkeypatch):
    """A progress callback that is the clock: each message advances ``time.perf_counter`` by one second,
    so that every duration the search measures is a count of messages, the same on every run; budgets
    from one second allowed."""
    clock = {"now": 0.0}

    def tick(stage, fraction, message):
        clock["now"] += 1.0

    monkeypatch.setattr(search_module.time, "perf_counter", lambda: clock["now"])
    monkeypatch.setattr(quantcore.config.auto, "AUTO_BUDGET_SECONDS", (1.0, 86_400.0))
    return tick


class TimeLimit(Exception):
    """What a worker's cancellation check raises once its time limit has passed (Celery's is an Exception)."""
