"""TensorRT INT8 explicit quantization: where Q/DQ go so that TensorRT fuses them.

- Conv, ConvTranspose, Gemm, MatMul (``quantize_compute``): the activation input per-tensor symmetric
  int8, q = clip(round(x / s), -128, 127) with s = amax / 127 (amax from the run's observer); a weight
  initializer per-channel symmetric int8 on its output-channel axis (Conv W axis 0, depthwise and
  grouped included; ConvTranspose W axis 1; Gemm B axis 0 with transB=1, 1 without; MatMul B its last
  axis), amax per channel from minmax. A MatMul of two activations (attention) quantizes both, unless
  it reads probabilities over more than 128 positions (``quantcore.prepare.attention``: annotation keeps it float).
  Biases stay float (TensorRT quantizes them itself).
- Add of two activations (``residual_add``): TensorRT fuses an element-wise sum into the weighted layer
  (Conv/ConvTranspose/Gemm/MatMul with a constant weight, bias Add included) that produces one of its
  inputs, and that layer then accumulates in float; only the *other* input, the residual, gets Q/DQ
  (TensorRT's "quantize the residual input in skip connections"; the fused layer's output is never
  rounded to int8). With no such producer, the sum is a standalone element-wise layer: both inputs are
  quantized when its result is read in int8 (see below), else it stays float.
- Mul of two activations (a gate): both inputs. (Gating it like the Add cost the PP-OCRv4 recognizer
  1.4 dB in ``bench.quality``, 13.3 → 11.9, for a reason not yet found; it stays as it was.) Except a
  weighted layer's activation x · f(x), with x written by a Conv/ConvTranspose/Gemm/MatMul with a
  constant weight (through a bias Add or not, and reshapes before it: tf2onnx writes a 1-D convolution
  as a 2-D one, then Slice and Squeeze) and f element-wise (``GATE_OPS``): the Swish (SiLU)
  x · Sigmoid(x), and GELU as exporters write it, x · (1 + Erf(x / √2)) · 0.5 or its Tanh form.
  TensorRT fuses the whole of it into that layer's epilogue, as ModelOpt's partitioning also assumes
  (its fusible Conv → Sigmoid → Mul chain), so it gets no Q/DQ; the next weighted layer quantizes its
  result.
- Concat (inputs sharing one scale through ``dominator``, so the concat is a copy): only when the
  result is read in int8. An op "reads in int8" when it is a
  Conv/ConvTranspose/Gemm/MatMul data operand or an average pool, possibly behind ops Q/DQ commute
  through (``PASS_THROUGH_OPS``, Concat). A result read in float (a detector head concatenating sigmoid
  scores and raw box sizes into the model output) gains no integer kernel from the Q/DQ, only the
  rounding, and a scale shared by operands of different ranges costs the narrow ones their resolution.
- AveragePool/GlobalAveragePool: the input, so the pool runs in int8.
- Identity-like ops pass through; everything else (Softmax, LayerNormalization, Sigmoid, ...) stays
  float.

Only float32 tensors are quantized (QuantizeLinear-13 takes float32).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx

from quantcore.annotate.rules import (
    Platform,
    QuantRequest,
    Request,
    Rule,
    RuleContext,
    fusing_producer,
    layer_producer,
    pass_through,
    quantize_compute,
    quantize_elementwise,
    quantize_first_input,
    quantize_shared_inputs,
    reaches_reader,
)
from quantcore.graph.index import GraphIndex
from quantcore.graph.ops import COMPUTE_OPS, DATA_MOVEMENT_OPS
from quantcore.numerics.tqc import TensorQuantConfig

if TYPE_CHECKING:
    from quantcore.config import QuantizeConfig

# Data movement, and activations TensorRT fuses into the preceding layer.
PASS_THROUGH_OPS = DATA_MOVEMENT_OPS | {"Relu", "Clip", "LeakyRelu"}
INTEGER_READERS = COMPUTE_OPS | {"AveragePool", "GlobalAveragePool"}  # ops whose rule quantizes input 0


def activation(bits: int, observer: str, config: QuantizeConfig) -> TensorQuantConfig:
    """Per-tensor symmetric int8 (offset 0)."""
    return TensorQuantConfig(num_bits=bits, symmetric=True, observer=observer)


def weight(axis: int | None, bits: int, config: QuantizeConfig) -> TensorQuantConfig:
    """Symmetric int8, per-channel on ``axis`` (per-tensor if None); range from minmax."""
    if axis is None:
        return TensorQuantConfig(num_bits=bits, symmetric=True, observer="minmax")
    return TensorQuantConfig(num_bits=bits, symmetric=True, per_channel=True, channel_axis=axis, observer="minmax")


def read_in_integer(name: str, context: RuleContext) -> bool:
    """Whether a reader of ``name`` that is not excluded, directly or behind pass-through ops and Concat,
    is a data operand of an ``INTEGER_READERS`` op (input 0 or 1 of Conv/ConvTranspose/Gemm/MatMul,
    input 0 of a pool): then TensorRT consumes ``name`` as int8 codes."""
    return reaches_reader(
        name,
        context,
        takes=lambda node, position: (
            node.op_type in INTEGER_READERS and position <= (1 if node.op_type in COMPUTE_OPS else 0)
        ),
        passes_on=lambda node, position: (
            (node.op_type in PASS_THROUGH_OPS and position == 0) or node.op_type == "Concat"
        ),
    )


def weight_layer(producer: onnx.NodeProto | None, context: RuleContext) -> bool:
    """``producer`` is a layer whose input 1 is constant (a weight) and that the user did not exclude."""
    return producer is not None and context.index.is_constant(producer.input[1]) and not context.excluded(producer)


def fused_weighted_output(name: str, context: RuleContext) -> bool:
    """``name`` is the only reader's input from a weighted layer (``fusing_producer``) that the user did not
    exclude: TensorRT fuses that reader's element-wise sum into it."""
    return weight_layer(fusing_producer(name, context.index), context)


# ops of a layer's element-wise epilogue (Swish, GELU in its Erf and Tanh forms) that TensorRT fuses
GATE_OPS = frozenset({"Sigmoid", "Erf", "Tanh", "Add", "Sub", "Mul", "Div", "Pow"})
# ops that only reshape or select values between a layer and its bias Add (a 1-D conv through tf2onnx)
LAYER_RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Slice"})
GATE_DEPTH = 8  # GELU's Tanh form, the longest: x + 0.044715·x³ → ·√(2/π) → Tanh → + 1 is 6 ops deep


def computed_from(name: str, source: str, index: GraphIndex, depth: int = GATE_DEPTH) -> bool:
    """Whether ``name`` is ``source`` or computed from it alone (and constants) by ``GATE_OPS``."""
    if name == source:
        return True
    producer = index.producers.get(name)
    if depth == 0 or producer is None or producer.op_type not in GATE_OPS:
        return False
    variables = [i for i in producer.input if i and not index.is_constant(i)]
    return bool(variables) and all(computed_from(v, source, index, depth - 1) for v in variables)


def _ancestors(name: str, index: GraphIndex, depth: int = GATE_DEPTH) -> list[str]:
    """``name`` and the tensors ``GATE_OPS`` computed it from, up to ``depth`` ops back."""
    found, frontier = [name], [name]
    for _ in range(depth):
        producers = [index.producers.get(t) for t in frontier]
        frontier = [i for p in producers if p is not None and p.op_type in GATE_OPS for i in p.input]
        frontier = [t for t in frontier if t and not index.is_constant(t) and t not in found]
        found += frontier
    return found


def gate_mul(node: onnx.NodeProto, context: RuleContext) -> list[Request]:
    """Mul of two float32 activations (see module): both inputs, unless both are computed from one weighted
    layer's output x by ``GATE_OPS`` (Swish's x · Sigmoid(x), GELU's x · (1 + Erf(x / √2)), 0.5·x
    times that...): TensorRT fuses that into the layer."""
    if len(node.input) == 2:
        for x in _ancestors(node.input[0], context.index):
            layer = layer_producer(x, context.index, through=LAYER_RESHAPES)
            if layer is not None and all(computed_from(i, x, context.index) for i in node.input):
                return [] if weight_layer(layer, context) else quantize_elementwise(node, context)
    return quantize_elementwise(node, context)


def residual_add(node: onnx.NodeProto, context: RuleContext) -> list[Request]:
    """Add of two float32 activations (see module): the residual input only when the other input comes
    from a weighted layer TensorRT fuses the sum into (when both do, input 0's layer takes the sum);
    otherwise both inputs when the sum is read in int8; a bias Add stays float."""
    requests = quantize_elementwise(node, context)
    if not requests:
        return []
    fused = [i for i, name in enumerate(node.input) if fused_weighted_output(name, context)]
    if fused:
        residual = 1 - fused[0]
        return [QuantRequest(residual, context.activation())]
    return requests if read_in_integer(node.output[0], context) else []


def when_read_in_integer(rule: Rule) -> Rule:
    """``rule``, applied only to a node whose output 0 is read in int8 (``read_in_integer``)."""

    def gated(node: onnx.NodeProto, context: RuleContext) -> list[Request]:
        return rule(node, context) if node.output and read_in_integer(node.output[0], context) else []

    gated.__doc__ = f"{rule.__doc__}\nOnly when the result is read in int8 (TensorRT fuses nothing otherwise)."
    return gated


RULES: dict[str, Rule] = {
    "Conv": quantize_compute,
    "ConvTranspose": quantize_compute,
    "Gemm": quantize_compute,
    "MatMul": quantize_compute,
    "Add": residual_add,
    "Mul": gate_mul,
    "Concat": when_read_in_integer(quantize_shared_inputs),
    "AveragePool": quantize_first_input,
    "GlobalAveragePool": quantize_first_input,
    **{op_type: pass_through for op_type in PASS_THROUGH_OPS},
}

TENSORRT = Platform(
    name="tensorrt",
    rules=RULES,
    weight=weight,
    activation=activation,
    description="TensorRT INT8: symmetric per-channel weights, symmetric per-tensor activations, "
    "Q/DQ at the inputs of Conv/Gemm/MatMul, the residual input of an Add fused into its weighted layer, "
    "other Adds and Concat when read in int8, Mul of two activations (not a layer's Swish), and pooling",
)
