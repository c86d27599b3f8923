"""Empirical bias correction (Nagel et al. 2019, "Data-Free Quantization Through Weight Equalization and
Bias Correction", section 4.2, the empirical variant): after calibration, remove from each quantized
Conv/Gemm the mean shift that quantizing its weight causes on the calibration data.

For a layer y = W ⊛ x + b whose weight quantizes to Ŵ (its calibrated config, as export stores it):

    ε_c = mean over samples and positions of (Ŵ ⊛ x - W ⊛ x)[c]      for each output channel c
    b_c ← b_c - ε_c

x is the layer's FP32 input, so each layer's ε is its own weight's error alone: the corrections of
different layers neither double count nor depend on their order, and one pass over the calibration
data measures them all. Both outputs come from one ONNX Runtime session on the prepared graph, where
each corrected layer has a twin reading the same input with Ŵ in place of W; its outputs are reduced
batch by batch into per-channel sums (float64), so no more than one batch of activations is held.

Preconditions for a layer to be corrected: Conv or Gemm, its weight in the annotation's calibrated
parameters, a float32 bias initializer read by it alone with one value per output channel. A layer
without a bias is skipped (adding one would leave it outside the annotation, a float bias on the
platforms that store biases as int32).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import onnx
from onnx import numpy_helper

from quantcore.annotate.annotation import Annotation
from quantcore.config import QuantizeConfig
from quantcore.graph.index import GraphIndex, NameScope
from quantcore.numerics.fake_quant import fake_quantize_numpy
from quantcore.numerics.tqc import TensorQuantConfig
from quantcore.prepare.preparation import PreparedModel
from quantcore.progress import Monitor
from quantcore.runtime.batching import Batches
from quantcore.runtime.session import open_session

STAGE = "calibrate"
LAYERS = frozenset({"Conv", "Gemm"})


@dataclass(frozen=True)
class BiasCorrection:
    """What ``correct_biases`` did: layer name → max |ε_c| subtracted, and the layers skipped with why."""

    corrected: dict[str, float]
    skipped: dict[str, str]

    def statement(self) -> str:
        return f"bias correction: {len(self.corrected)} layers corrected, {len(self.skipped)} skipped"


def _skip_reason(node: onnx.NodeProto, index: GraphIndex, calibrated: Annotation) -> str | None:
    """Why ``node`` (a Conv/Gemm) cannot be corrected (module docstring), or None."""
    if len(node.input) < 2 or node.input[1] not in calibrated.parameters:
        return "weight not quantized"
    return _bias_problem(node, index)


def nothing_to_correct(prepared: PreparedModel, weights: Mapping[str, TensorQuantConfig]) -> str | None:
    """Why correcting ``prepared``'s biases for the calibrated weight configs ``weights`` would change nothing
    (no layer to correct, or weights already on their grids: ε = 0), or None where it would change some."""
    index = GraphIndex(prepared.model.graph)
    layers = [
        node
        for node in prepared.model.graph.node
        if node.op_type in LAYERS
        and len(node.input) > 1
        and node.input[1] in weights
        and _bias_problem(node, index) is None
    ]
    if not layers:
        return "no Conv/Gemm with a bias to correct"
    exact = all(
        np.array_equal(fake_quantize_numpy(index.array(n.input[1]), weights[n.input[1]]), index.array(n.input[1]))
        for n in layers
    )
    return "the Conv/Gemm weights are already on their quantization grids, no mean shift to correct" if exact else None


def _bias_problem(node: onnx.NodeProto, index: GraphIndex) -> str | None:
    """Why ``node``'s bias (a Conv/Gemm with a weight initializer) cannot take a correction, or None."""
    if len(node.input) < 3 or not node.input[2]:
        return "no bias"
    bias = node.input[2]
    if not (index.is_initializer(bias) and index.is_float32(bias, unknown=False)) or len(index.consumers[bias]) != 1:
        return "bias not a float32 initializer of its own"
    channels = index.initializers[node.input[1]].dims[0]
    if node.op_type == "Gemm":
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        channels = index.initializers[node.input[1]].dims[0 if attributes.get("transB", 0) else 1]
    dims = list(index.initializers[bias].dims)
    if int(np.prod(dims)) != channels or (len(dims) == 2 and dims[0] != 1):
        return "bias not one value per output channel"
    return None


def correct_biases(
    prepared: PreparedModel, calibrated: Annotation, batches: Batches, config: QuantizeConfig, monitor: Monitor
) -> tuple[PreparedModel, BiasCorrection]:
    """``prepared`` with each correctable layer's bias minus its ε (module docstring), in a copy of its
    model; ``calibrated``'s configs stay valid (weights are unchanged; int32 bias scales are derived at
    export). Checks for cancellation before each batch."""
    graph = prepared.model.graph
    index = GraphIndex(graph)
    scope = NameScope(index.used_names())
    skipped: dict[str, str] = {}
    twins: dict[str, tuple[str, str]] = {}  # layer name → (its output, its twin's output)
    measured = onnx.ModelProto()
    measured.CopyFrom(prepared.model)
    for node in graph.node:
        if node.op_type not in LAYERS:
            continue
        reason = _skip_reason(node, index, calibrated)
        if reason is not None:
            skipped[node.name] = reason
            continue
        weight = fake_quantize_numpy(index.array(node.input[1]), calibrated.configs[node.input[1]])
        weight_name, output = scope.fresh(f"{node.input[1]}.quantized"), scope.fresh(f"{node.output[0]}.quantized")
        measured.graph.initializer.append(numpy_helper.from_array(weight.astype(np.float32), weight_name))
        twin = measured.graph.node.add()
        twin.CopyFrom(node)
        twin.name = scope.fresh(f"{node.name}.quantized")
        twin.input[1] = weight_name
        twin.output[:] = [output]
        twins[node.name] = (node.output[0], output)
    if not twins:
        return prepared, BiasCorrection({}, skipped)

    names = [name for pair in twins.values() for name in pair]
    sums: dict[str, np.ndarray | float] = dict.fromkeys(twins, 0.0)  # layer → (C_out,) Σ of Ŵ ⊛ x - W ⊛ x
    counts = dict.fromkeys(twins, 0)
    with open_session(measured, device=config.device, outputs=names) as session:
        for batch in batches:
            monitor.check(STAGE)
            values = dict(zip(names, session.run(names, dict(batch)), strict=True))
            for layer, (output, twin_output) in twins.items():
                shift = values[twin_output].astype(np.float64) - values[output]  # (N, C, ...)
                per_channel = np.moveaxis(shift, 1, 0).reshape(shift.shape[1], -1)
                sums[layer] = sums[layer] + per_channel.sum(axis=1)
                counts[layer] += per_channel.shape[1]
            del values

    corrected: dict[str, float] = {}
    biases: dict[str, np.ndarray] = {}
    for node in graph.node:
        if node.name in twins:
            epsilon = sums[node.name] / max(counts[node.name], 1)
            bias = index.array(node.input[2])
            biases[node.input[2]] = (bias.reshape(-1) - epsilon).astype(np.float32).reshape(bias.shape)
            corrected[node.name] = float(np.max(np.abs(epsilon)))
    model = onnx.ModelProto()
    model.CopyFrom(prepared.model)
    for tensor in model.graph.initializer:
        if tensor.name in biases:
            tensor.CopyFrom(numpy_helper.from_array(biases[tensor.name], tensor.name))
    return replace(prepared, model=model), BiasCorrection(corrected, skipped)
