"""ONNX Runtime, weight-only: MatMul/Gemm weights stored at 4 or 8 bits in blocks along the reduction
axis, activations float32. What ``MatMulNBits`` (the CPU EP's n-bit GEMM) or opset-21 blocked
DequantizeLinear run; the blocks, the algorithm and the format are ``QuantizeConfig.weight_only``'s, and
``quantcore.weight_only`` computes and writes them.

The rules only choose the layers; each chosen weight's annotation is a per-channel TQC on its output
axis at the precision's bits (what one block per column would be), a marker the report and the
weight-only stages read, not the block layout itself. Chosen: a MatMul whose input 1 is a 2-D float32
initializer read by no other node, and a Gemm of the same with transA=0, alpha=1 and beta=1 (transB
either way). Kept float, with the reason recorded:

- the LM head, the MatMul/Gemm whose output (or its bias Add's) is a graph output, unless
  ``weight_only.quantize_lm_head``: its error reaches the logits without anything after it to absorb it;
- embedding lookups (Gather of a float initializer), unless ``weight_only.quantize_embeddings``; then a
  Gather along axis 0 of a 2-D float32 table that no other node reads is chosen (its marker per row, axis
  0), and kept float with the reason when it is not one, or when its rows have an odd length at 4 bits
  (``GatherBlockQuantized`` stores two codes per byte along the row and cannot end on half a byte);
- a weight read by several nodes (tied embeddings): one stored copy cannot serve a Gather as well;
- weights that are not 2-D, and Gemms with transA, alpha or beta other than the plain product.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx

from quantcore.annotate.rules import (
    FloatReason,
    Platform,
    QuantRequest,
    Request,
    RuleContext,
    attribute,
    is_float_activation,
    weight_axis,
)
from quantcore.numerics.tqc import QuantState, TensorQuantConfig

if TYPE_CHECKING:
    from quantcore.config import QuantizeConfig

LM_HEAD_REASON = "LM head (its output is a graph output) kept float; weight_only.quantize_lm_head quantizes it"
EMBEDDING_REASON = "embedding lookup (Gather of a float table) kept float; weight_only.quantize_embeddings quantizes it"


def weight(axis: int | None, bits: int, config: QuantizeConfig) -> TensorQuantConfig:
    """Per-channel on the output axis at ``bits``, symmetric as ``weight_only.symmetric`` says: the
    annotation's marker of a weight-only layer (the blocks are ``config.weight_only``'s)."""
    symmetric = config.weight_only is None or config.weight_only.symmetric
    return TensorQuantConfig(num_bits=bits, symmetric=symmetric, per_channel=True, channel_axis=axis, observer="minmax")


def activation(bits: int, observer: str, config: QuantizeConfig) -> TensorQuantConfig:
    """Activations stay float: an 8-bit config in state FP32. No rule requests it; the annotation asks a
    platform's preset only whether it is floating (``annotation.long_attention``)."""
    return TensorQuantConfig(num_bits=8, observer=observer, state=QuantState.FP32)


def writes_graph_output(node: onnx.NodeProto, context: RuleContext) -> bool:
    """Whether ``node``'s output is a graph output, directly or through one Add of a constant (a bias)."""
    outputs = set(context.index.graph_outputs)
    name = node.output[0]
    if name in outputs:
        return True
    readers = context.index.consumers.get(name, [])
    return any(
        reader.op_type == "Add"
        and any(context.index.is_constant(i) for i in reader.input if i != name)
        and reader.output[0] in outputs
        for reader, _ in readers
    )


def quantize_weight(node: onnx.NodeProto, context: RuleContext) -> list[Request]:
    """The weight (input 1) of a MatMul/Gemm the module docstring admits, or the reason it stays float."""
    index = context.index
    if len(node.input) < 2 or not is_float_activation(node.input[0], index):
        return []
    name = node.input[1]
    if not index.is_initializer(name) or not index.is_float32(name, unknown=False):
        return []  # an activation by activation product (attention): nothing to store
    if len(index.initializers[name].dims) != 2:
        return [FloatReason(f"weight {name} is not 2-D")]
    if node.op_type == "Gemm" and (
        attribute(node, "transA", 0) or _float_attribute(node, "alpha") != 1.0 or _float_attribute(node, "beta") != 1.0
    ):
        return [FloatReason("Gemm with transA, alpha or beta other than 1 kept float")]
    if len(index.consumers.get(name, [])) > 1:
        return [FloatReason(f"weight {name} is read by several nodes (tied weights) and kept float")]
    weight_only = context.config.weight_only
    if writes_graph_output(node, context) and not (weight_only is not None and weight_only.quantize_lm_head):
        return [FloatReason(LM_HEAD_REASON)]
    return [QuantRequest(1, context.weight(weight_axis(node, index)))]


def _float_attribute(node: onnx.NodeProto, name: str) -> float:
    for entry in node.attribute:
        if entry.name == name:
            return float(onnx.helper.get_attribute_value(entry))
    return 1.0


def embedding(node: onnx.NodeProto, context: RuleContext) -> list[Request]:
    """A Gather from a float initializer (an embedding table): quantized per the module docstring with
    ``weight_only.quantize_embeddings``, else kept float, saying so."""
    index = context.index
    table = node.input[0]
    if not index.is_initializer(table) or not index.is_float32(table, unknown=False):
        return []
    weight_only = context.config.weight_only
    if weight_only is None or not weight_only.quantize_embeddings:
        return [FloatReason(EMBEDDING_REASON)]
    dims = list(index.initializers[table].dims)
    if len(dims) != 2 or attribute(node, "axis", 0) != 0:
        return [FloatReason(f"embedding {table} is not a 2-D table gathered along axis 0; kept float")]
    if len(index.consumers.get(table, [])) > 1:
        return [FloatReason(f"embedding {table} is read by several nodes (tied weights) and kept float")]
    if context.weight_bits == 4 and dims[1] % 2:
        return [FloatReason(f"embedding {table} has rows of odd length {dims[1]}, which 4-bit storage cannot pack")]
    return [QuantRequest(0, context.weight(0))]


ONNXRUNTIME_WEIGHT_ONLY = Platform(
    name="onnxruntime-weight-only",
    rules={"MatMul": quantize_weight, "Gemm": quantize_weight, "Gather": embedding},
    weight=weight,
    activation=activation,
    description="ONNX Runtime, weight-only: MatMul/Gemm weights at 4 or 8 bits in blocks along K (MatMulNBits or "
    "blocked DequantizeLinear), activations float; embeddings and the LM head float by default",
)
