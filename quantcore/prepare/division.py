"""A division by a constant becomes a product by its reciprocal, so that runtimes with an integer kernel for
Mul and none for Div can keep it integer.

``Div(x, c)``, c a float32 initializer with no zero and no non-finite element, is rewritten in place as
``Mul(x, 1 / c)``: the node keeps its name and output, the reciprocal is a new initializer (the divisor is
dropped once nothing else reads it). The result differs from the division's by at most one rounding of
1 / c (a relative 6e-8). The case that motivates it: a hard swish written out as x · relu6(x + 3) / 6
(PaddleOCR's detectors and classifiers), whose division by 6 ONNX Runtime's CPU EP ran in float between a
dequantization and a quantization: 20 % of PP-OCRv4's quantized detector at batch 4, where the product is
one more QLinearMul in a chain of them.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from quantcore.graph.index import GraphIndex, NameScope
from quantcore.prepare.folding import remove_unused_initializers


def divisions_as_products(graph: onnx.GraphProto) -> list[str]:
    """Rewrite every eligible Div (module docstring) in ``graph``; return the rewritten nodes' names."""
    index = GraphIndex(graph)
    scope = NameScope(index.used_names())
    rewritten: list[str] = []
    for node in graph.node:
        if node.op_type != "Div" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        divisor = node.input[1]
        if not index.is_initializer(divisor) or not index.is_float32(divisor, unknown=False):
            continue
        values = index.array(divisor)
        if not np.all(np.isfinite(values)) or np.any(values == 0):
            continue
        reciprocal = (1.0 / values.astype(np.float64)).astype(np.float32)
        if not np.all(np.isfinite(reciprocal)):  # a subnormal divisor: its reciprocal overflows float32
            continue
        name = scope.fresh(f"{divisor}.reciprocal")
        graph.initializer.append(numpy_helper.from_array(reciprocal, name))
        node.op_type, node.input[1] = "Mul", name
        rewritten.append(node.name)
    if rewritten:
        remove_unused_initializers(graph)  # the divisors only the rewritten nodes read
    return rewritten
