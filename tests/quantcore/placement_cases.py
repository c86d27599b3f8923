"""The small model and the placement run the placement's and the node profiler's tests share."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantcore import QuantizeConfig, annotate, calibrate, export, prepare
from quantcore.analysis.placement import PlacementRun
from quantcore.config import AnalysisOptions
from quantcore.runtime.batching import Batches, input_specs
from tests.quantcore.models import save

# the options every run here shares: no clip search, analysis or latency stage (they do not concern placement)
FAST = {"platform": "onnxruntime", "percentile_candidates": (), "analysis": AnalysisOptions(enabled=False)}


def two_regions() -> onnx.ModelProto:
    """input (N, 3, 8, 8) → conv1 → relu1 → softmax (float on the CPU EP) → conv2 → relu2 → out.

    Softmax stays float, so the quantized nodes form two regions: {conv1, relu1} and {conv2} (relu2 writes
    the graph's output, read in float: nothing to quantize there)."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name)
        for name, shape in (("w1", (4, 3, 3, 3)), ("b1", (4,)), ("w2", (4, 4, 3, 3)), ("b2", (4,)))
    ]
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Softmax", ["r1"], ["s"], name="softmax", axis=1),
        helper.make_node("Conv", ["s", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["out"], name="relu2"),
    ]
    graph = helper.make_graph(
        nodes,
        "two_regions",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 4, 8, 8])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def calibration_data() -> np.ndarray:
    return np.random.default_rng(1).normal(size=(32, 3, 8, 8)).astype(np.float32)


def reads_dequantized(model: onnx.ModelProto, node_name: str) -> bool:
    producers = {out: node for node in model.graph.node for out in node.output}
    node = next(n for n in model.graph.node if n.name == node_name)
    return any(producers.get(name) is not None and producers[name].op_type == "DequantizeLinear" for name in node.input)


def placement_run(
    tmp_path: Path,
    data: np.ndarray,
    config: QuantizeConfig,
    model: onnx.ModelProto | None = None,
    calibration_seconds: float = 100.0,
) -> PlacementRun:
    path = save(model or two_regions(), tmp_path / "model.onnx")
    prepared = prepare(path)
    base = annotate(prepared, config)
    calibrated = calibrate(prepared, base, {"input": data}, config)
    exported = export(prepared, calibrated, tmp_path / "out", platform=config.platform)
    batches = Batches({"input": data}, input_specs(prepared.model), config.batch_size, what="calibration")
    sample = {"input": data[:16]}
    return PlacementRun(prepared, batches, sample, base, calibrated, exported, tmp_path / "out", calibration_seconds)
