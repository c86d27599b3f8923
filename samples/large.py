"""Models past protobuf's 2 GiB, built without holding them whole: a chain of MatMuls whose weights
``external_tensor`` appends one at a time to the model's ``.data`` file. Used by the large-model tests
(tests/quantcore/test_large_models.py) and by ``bench.models.cases.large_cases`` (the 2.42 GB ``mlp-2g``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def matmul_chain(layers: int, width: int, weight: Callable[[int], onnx.TensorProto]) -> onnx.ModelProto:
    """input (N, width) -> ``layers`` x (MatMul "matmul{i}" by ``weight(i)``, a tensor named "w{i}"; Add of
    a zero bias "b{i}"; Relu) -> output (N, width)."""
    nodes, initializers, x = [], [], "input"
    for i in range(layers):
        initializers += [weight(i), numpy_helper.from_array(np.zeros(width, np.float32), f"b{i}")]
        y = "output" if i == layers - 1 else f"r{i}"
        nodes += [
            helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"], name=f"matmul{i}"),
            helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"add{i}"),
            helper.make_node("Relu", [f"a{i}"], [y], name=f"relu{i}"),
        ]
        x = y
    io = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", width]) for name in ("input", "output")]
    graph = helper.make_graph(nodes, "chain", io[:1], io[1:], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def external_tensor(name: str, array: np.ndarray, data) -> onnx.TensorProto:
    """A tensor whose data ``array`` is appended to the open file ``data`` (named ``<model>.data``,
    beside the model): how a model past 2 GiB is written without holding it in one protobuf."""
    tensor = TensorProto(name=name, dims=array.shape, data_type=helper.np_dtype_to_tensor_dtype(array.dtype))
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", Path(data.name).name), ("offset", str(data.tell())), ("length", str(array.nbytes))):
        tensor.external_data.add(key=key, value=value)
    array.tofile(data)
    return tensor
