"""The float model behind a QDQ model, for a bench model whose wheel ships only its quantized export
(pipecat's smart-turn): every DequantizeLinear of a constant becomes a float32 initializer holding its
value, and every QuantizeLinear → DequantizeLinear pair on an activation is removed, its readers reading
the float tensor again. The weights stay on their int8 grid; everything else is the original graph.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper


def _dequantized_constant(node: onnx.NodeProto, values: dict[str, np.ndarray]) -> np.ndarray:
    """The float32 value of a DequantizeLinear of constants: (q - zero point) · scale, per ``axis``."""
    quantized = values[node.input[0]].astype(np.float32)
    scale = values[node.input[1]].astype(np.float32)
    zero = values[node.input[2]].astype(np.float32) if len(node.input) > 2 and node.input[2] else np.zeros_like(scale)
    if scale.ndim == 1 and scale.size > 1:  # per channel
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        shape = [1] * quantized.ndim
        shape[axis] = -1
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    return (quantized - zero) * scale


def dequantize(source: Path, target: Path) -> Path:
    """Write ``source``'s float model (module docstring) to ``target``, once; returns ``target``."""
    if target.is_file():
        return target
    model = onnx.load(str(source))
    graph = model.graph
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    producers = {output: node for node in graph.node for output in node.output}
    floats: dict[str, str] = {}  # an activation pair's DequantizeLinear output → the float tensor it rounded
    weights = []
    kept = []
    for node in graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0] in values:
            weights.append(numpy_helper.from_array(_dequantized_constant(node, values), node.output[0]))
        elif node.op_type == "DequantizeLinear":
            floats[node.output[0]] = producers[node.input[0]].input[0]
        elif node.op_type != "QuantizeLinear":
            kept.append(node)
    for node in kept:
        for position, name in enumerate(node.input):
            node.input[position] = floats.get(name, name)
    for output in graph.output:
        output.name = floats.get(output.name, output.name)
    read = {name for node in kept for name in node.input}
    initializers = [t for t in graph.initializer if t.name in read] + [t for t in weights if t.name in read]
    del graph.node[:], graph.initializer[:], graph.value_info[:]
    graph.node.extend(kept)
    graph.initializer.extend(initializers)
    target.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(target))
    return target
