"""Platform rule sets: what each places, per op family, and the user's overrides (structure only;
numerics of the exported models are in test_export and test_parity)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantcore import PLATFORMS, NodeOverride, QuantizeConfig, QuantState, annotate, calibrate, prepare
from quantcore.annotate.annotation import NodeInput
from quantcore.config import accepts_precision
from quantcore.numerics.precision import parse_precision
from tests.quantcore.models import conv_bn_residual, masked_attention, matmul_convtranspose, padded_tokens


def _init(name: str, array) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array, dtype=np.float32), name)


def _model(name: str, nodes: list, inputs: dict, outputs: dict, inits: list, ir_version: int) -> onnx.ModelProto:
    """An opset-17 model of float32 ``inputs`` and ``outputs`` (name → shape, None: unknown)."""
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in outputs.items()],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = ir_version
    return model


def attention() -> onnx.ModelProto:
    """x (N, T, 8) → q, k, v projections → softmax(q·kᵀ)·v → + x → LayerNormalization → out.
    Node names: wq, wk, wv, kt, scores, softmax, context, residual, norm."""
    rng = np.random.default_rng(0)
    inits = [_init(n, rng.normal(0, 0.3, (8, 8))) for n in ("Wq", "Wk", "Wv")]
    inits += [_init("gamma", np.ones(8)), _init("beta", np.zeros(8))]
    nodes = [
        helper.make_node("MatMul", ["x", "Wq"], ["q"], name="wq"),
        helper.make_node("MatMul", ["x", "Wk"], ["k"], name="wk"),
        helper.make_node("MatMul", ["x", "Wv"], ["v"], name="wv"),
        helper.make_node("Transpose", ["k"], ["k_t"], name="kt", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "k_t"], ["s"], name="scores"),
        helper.make_node("Softmax", ["s"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["o"], name="context"),
        helper.make_node("Add", ["o", "x"], ["h"], name="residual"),
        helper.make_node("LayerNormalization", ["h", "gamma", "beta"], ["out"], name="norm", axis=-1),
    ]
    return _model("attention", nodes, {"x": ["N", "T", 8]}, {"out": ["N", "T", 8]}, inits, 8)


def depthwise_concat_head() -> onnx.ModelProto:
    """x (N, 4, 6, 6) → depthwise Conv (group 4) → Relu → r; 1x1 Conv(r) → c; Concat(r, c) →
    GlobalAveragePool → Flatten → Gemm → logits → Sigmoid → probs. Node names as the tensors."""
    rng = np.random.default_rng(1)
    inits = [
        _init("dw.w", rng.normal(0, 0.5, (4, 1, 3, 3))),
        _init("pw.w", rng.normal(0, 0.5, (4, 4, 1, 1))),
        _init("fc.w", rng.normal(0, 0.5, (3, 8))),
        _init("fc.b", np.zeros(3)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "dw.w"], ["d"], name="dw", group=4, pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["d"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "pw.w"], ["c"], name="pw"),
        helper.make_node("Concat", ["r", "c"], ["cat"], name="concat", axis=1),
        helper.make_node("GlobalAveragePool", ["cat"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["logits"], name="fc", transB=1),
        helper.make_node("Sigmoid", ["logits"], ["probs"], name="sigmoid"),
    ]
    return _model("depthwise_concat_head", nodes, {"x": ["N", 4, 6, 6]}, {"probs": ["N", 3]}, inits, 8)


def test_registry_names_and_precisions() -> None:
    assert set(PLATFORMS) == {
        "tensorrt",
        "tensorrt-fp8",
        "onnxruntime",
        "onnxruntime-dynamic",
        "onnxruntime-weight-only",
        "academic",
    }
    assert accepts_precision("onnxruntime-weight-only", "w4") and not accepts_precision("academic", "w4")
    assert not accepts_precision("onnxruntime-weight-only", "int8")
    assert not accepts_precision("onnxruntime-dynamic", "w4a8")  # DynamicQuantizeLinear is uint8 only
    assert accepts_precision("tensorrt-fp8", "fp8") and not accepts_precision("tensorrt-fp8", "int8")
    assert not accepts_precision("tensorrt", "fp8") and not accepts_precision("onnxruntime", "w4a8")
    assert accepts_precision("academic", "w2a4") and not accepts_precision("academic", "fp8")
    assert parse_precision("w4a8").weight_bits == 4 and parse_precision("w4a8").activation_bits == 8
    with pytest.raises(ValueError, match="precision"):
        QuantizeConfig(platform="onnxruntime", precision="fp8")


def test_tensorrt_attention_matmuls_and_float_softmax_layernorm() -> None:
    annotation = annotate(prepare(attention()), QuantizeConfig(observer="minmax"))
    configs = annotation.configs
    # q·kᵀ and p·v: both operands are activations, both quantized per-tensor
    assert {"q", "k_t"} <= set(configs) and not configs["k_t"].per_channel
    assert annotation.consumers["p"] == (NodeInput("context", 0),) and "v" in configs
    for weight in ("Wq", "Wk", "Wv"):
        assert configs[weight].per_channel and configs[weight].channel_axis == 1  # (K, N): N
    assert annotation.decisions["softmax"] == annotation.decisions["norm"] == "float"
    assert "no integer rule for Softmax" in annotation.reasons["softmax"]
    # o = p·v is no weighted layer to fuse the sum into, and LayerNormalization reads the sum in float
    assert annotation.decisions["residual"] == "float" and "o" not in configs
    assert NodeInput("residual", 1) not in annotation.consumers["x"]
    assert annotation.decisions["kt"] == "pass_through"


def test_tensorrt_depthwise_concat_shares_one_scale() -> None:
    prepared = prepare(depthwise_concat_head())
    config = QuantizeConfig(observer="minmax")
    annotation = annotate(prepared, config)
    configs = annotation.configs
    assert configs["dw.w"].per_channel and configs["dw.w"].channel_axis == 0  # (C_out=4, 1, 3, 3)
    assert configs["c"].dominator == "r" and configs["r"].dominator is None
    assert "cat" in configs  # GlobalAveragePool's input
    assert annotation.decisions["sigmoid"] == "float"
    x = np.random.default_rng(0).normal(size=(8, 4, 6, 6)).astype(np.float32)
    calibrated = calibrate(prepared, annotation, {"x": x}, config).configs
    assert calibrated["c"].state is QuantState.PASSIVE and calibrated["c"].scale == calibrated["r"].scale


def join_model(op: str, left: str, right: str, reader: str) -> onnx.ModelProto:
    """x (N, 4, 6, 6) → Conv "ca" → a → Relu → ra; Conv "cb" → b; Conv "cc" → c; ``op``(left, right) → j
    (node "join", Concat on axis 1) → ``reader`` ("Conv": a 1x1 Conv "tail"; else a ReduceMean) → out.
    ``left`` and ``right`` name any of x, a, ra, b, c (an unused c is a second graph output)."""
    rng = np.random.default_rng(2)
    channels = 8 if op == "Concat" else 4
    inits = [_init(n, rng.normal(0, 0.5, (4, 4, 1, 1))) for n in ("ca.w", "cb.w", "cc.w")]
    inits.append(_init("tail.w", rng.normal(0, 0.5, (2, channels, 1, 1))))
    nodes = [
        helper.make_node("Conv", ["x", "ca.w"], ["a"], name="ca"),
        helper.make_node("Relu", ["a"], ["ra"], name="relu"),
        helper.make_node("Conv", ["x", "cb.w"], ["b"], name="cb"),
        helper.make_node("Conv", ["x", "cc.w"], ["c"], name="cc"),
        helper.make_node(op, [left, right], ["j"], name="join", **({"axis": 1} if op == "Concat" else {})),
        helper.make_node("Conv", ["j", "tail.w"], ["out"], name="tail")
        if reader == "Conv"
        else helper.make_node("ReduceMean", ["j"], ["out"], name="tail", keepdims=0),
    ]
    outputs = {name: None for name in ("out", "c")[: 1 + ("c" not in (left, right))]}
    return _model("join", nodes, {"x": ["N", 4, 6, 6]}, outputs, inits, 10)


@pytest.mark.parametrize(
    ("op", "left", "right", "reader", "quantized"),
    [
        # the sum fuses into the Conv writing b (b's only reader is the Add): only the residual x
        ("Add", "b", "x", "ReduceMean", {"x"}),
        ("Add", "x", "b", "Conv", {"x"}),
        # a is also read by the Relu, so its Conv cannot take the sum; b's Conv does, a is the residual
        ("Add", "a", "b", "ReduceMean", {"a"}),
        # both inputs could take the sum: input 0's Conv does, input 1 is the residual
        ("Add", "c", "b", "ReduceMean", {"b"}),
        # a Relu between Conv and Add: no fusion; a standalone sum is quantized only when read in int8
        ("Add", "ra", "x", "ReduceMean", set()),
        ("Add", "ra", "x", "Conv", {"ra", "x"}),
        # a Mul of two activations (a gate) quantizes both, whoever reads it
        ("Mul", "ra", "x", "ReduceMean", {"ra", "x"}),
        # a Concat read in float (a detector head's output) stays float; read by a Conv: one shared scale
        ("Concat", "ra", "b", "ReduceMean", set()),
        ("Concat", "ra", "b", "Conv", {"ra", "b"}),
    ],
)
def test_tensorrt_joins_follow_its_fusions(op: str, left: str, right: str, reader: str, quantized: set[str]) -> None:
    annotation = annotate(prepare(join_model(op, left, right, reader)), QuantizeConfig())
    join_inputs = {name for name, uses in annotation.consumers.items() if any(u.node == "join" for u in uses)}
    assert join_inputs == quantized
    assert annotation.decisions["join"] == ("quantized" if quantized else "float")
    if op == "Concat" and quantized:
        assert annotation.configs["b"].dominator == "ra"


def swish_model(gated: str, bias: bool) -> onnx.ModelProto:
    """x (N, 4, 6, 6) → Conv "ca" (then a bias Add "bias" of a constant if ``bias``) → a; Sigmoid(``gated``)
    → s (node "sig"); Mul(a, s) → m (node "swish"); 1x1 Conv "tail" → out. ``gated`` "a": YOLOv8's SiLU."""
    rng = np.random.default_rng(3)
    inits = [_init(n, rng.normal(0, 0.5, (4, 4, 1, 1))) for n in ("ca.w", "tail.w")]
    inits.append(_init("ca.b", rng.normal(0, 0.5, (1, 4, 1, 1))))
    conv = helper.make_node("Conv", ["x", "ca.w"], ["y" if bias else "a"], name="ca")
    nodes = [conv, helper.make_node("Add", ["y", "ca.b"], ["a"], name="bias")] if bias else [conv]
    nodes += [
        helper.make_node("Sigmoid", [gated], ["s"], name="sig"),
        helper.make_node("Mul", ["a", "s"], ["m"], name="swish"),
        helper.make_node("Conv", ["m", "tail.w"], ["out"], name="tail"),
    ]
    return _model("swish", nodes, {"x": ["N", 4, 6, 6]}, {"out": None}, inits, 10)


@pytest.mark.parametrize(
    ("gated", "bias", "exclude", "quantized"),
    [
        # x · Sigmoid(x) of a Conv's output (with its bias Add or not): TensorRT fuses it into the Conv
        ("a", False, (), set()),
        ("a", True, (), set()),
        # a gate from elsewhere, or a Conv the user keeps float: a Mul of two activations, both quantized
        ("x", False, (), {"a", "s"}),
        ("a", False, ("ca",), {"a", "s"}),
    ],
)
def test_tensorrt_leaves_a_layers_swish_to_its_fusion(
    gated: str, bias: bool, exclude: tuple[str, ...], quantized: set[str]
) -> None:
    config = QuantizeConfig(exclude_node_patterns=exclude)
    annotation = annotate(prepare(swish_model(gated, bias)), config)
    swish_inputs = {name for name, uses in annotation.consumers.items() if any(u.node == "swish" for u in uses)}
    assert swish_inputs == quantized
    assert annotation.decisions["swish"] == ("quantized" if quantized else "float")
    assert NodeInput("tail", 0) in annotation.consumers["m"]  # the next layer quantizes the Swish's result


def test_tensorrt_leaves_a_swish_behind_a_reshaped_layer_to_its_fusion() -> None:
    # tf2onnx's 1-D convolution: Unsqueeze → Conv (2-D) → Slice → Squeeze → bias Add, then x · Sigmoid(x)
    rng = np.random.default_rng(4)
    inits = [
        _init("ca.w", rng.normal(0, 0.5, (4, 4, 3, 1))),
        _init("ca.b", rng.normal(0, 0.5, (1, 4, 1))),
        _init("tail.w", rng.normal(0, 0.5, (4, 4, 1))),
        numpy_helper.from_array(np.array([3], np.int64), "axis3"),
        numpy_helper.from_array(np.array([0], np.int64), "start"),
        numpy_helper.from_array(np.array([1], np.int64), "stop"),
    ]
    nodes = [
        helper.make_node("Unsqueeze", ["x", "axis3"], ["x4"], name="to_2d"),
        helper.make_node("Conv", ["x4", "ca.w"], ["y4"], name="ca", pads=[1, 0, 1, 0]),
        helper.make_node("Slice", ["y4", "start", "stop", "axis3"], ["ys"], name="crop"),
        helper.make_node("Squeeze", ["ys", "axis3"], ["y"], name="to_1d"),
        helper.make_node("Add", ["y", "ca.b"], ["a"], name="bias"),
        helper.make_node("Sigmoid", ["a"], ["s"], name="sig"),
        helper.make_node("Mul", ["a", "s"], ["m"], name="swish"),
        helper.make_node("Conv", ["m", "tail.w"], ["out"], name="tail"),
    ]
    model = _model("swish1d", nodes, {"x": ["N", 4, 6]}, {"out": None}, inits, 10)
    annotation = annotate(prepare(model), QuantizeConfig())
    assert annotation.decisions["swish"] == "float"
    assert set(annotation.activations) == {"x4", "m"}  # the two convolutions' inputs, nothing inside


def gelu_model(half_first: bool) -> onnx.ModelProto:
    """x (N, T, 4) → MatMul "fc1" + bias → a; GELU as exporters write it, a · (1 + Erf(a / √2)) · 0.5 (torch:
    the Mul "gelu" of a and the Erf term first; ``half_first``: 0.5 · a first, then "gelu") → g; MatMul
    "fc2" → out."""
    rng = np.random.default_rng(4)
    inits = [_init(n, rng.normal(0, 0.5, (4, 4))) for n in ("W1", "W2")]
    inits += [_init("b1", rng.normal(0, 0.5, 4)), _init("root2", np.sqrt(2.0)), _init("one", 1.0), _init("half", 0.5)]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["y"], name="fc1"),
        helper.make_node("Add", ["y", "b1"], ["a"], name="bias"),
        helper.make_node("Div", ["a", "root2"], ["d"], name="div"),
        helper.make_node("Erf", ["d"], ["e"], name="erf"),
        helper.make_node("Add", ["e", "one"], ["e1"], name="plus1"),
    ]
    if half_first:
        nodes += [
            helper.make_node("Mul", ["a", "half"], ["h"], name="half"),
            helper.make_node("Mul", ["h", "e1"], ["g"], name="gelu"),
        ]
    else:
        nodes += [
            helper.make_node("Mul", ["a", "e1"], ["m"], name="gelu"),
            helper.make_node("Mul", ["m", "half"], ["g"], name="half"),
        ]
    nodes.append(helper.make_node("MatMul", ["g", "W2"], ["out"], name="fc2"))
    return _model("gelu", nodes, {"x": ["N", "T", 4]}, {"out": None}, inits, 10)


@pytest.mark.parametrize("half_first", [False, True])
def test_tensorrt_leaves_a_layers_gelu_to_its_fusion(half_first: bool) -> None:
    annotation = annotate(prepare(gelu_model(half_first)), QuantizeConfig())
    assert annotation.decisions["gelu"] == "float"
    assert set(annotation.activations) == {"x", "g"}  # the two layers' inputs, nothing inside the GELU
    excluded = annotate(prepare(gelu_model(half_first)), QuantizeConfig(exclude_node_patterns=("fc1",)))
    assert excluded.decisions["gelu"] == "quantized"  # no int8 layer to fuse into: a gate like any other


def test_tensorrt_add_is_not_fused_into_an_excluded_conv() -> None:
    # with "cb" kept in float by the user there is no int8 layer to take the sum: ReduceMean reads it in
    # float, so the Add stays float rather than quantizing x alone
    config = QuantizeConfig(exclude_node_patterns=("cb",))
    annotation = annotate(prepare(join_model("Add", "b", "x", "ReduceMean")), config)
    assert annotation.decisions["join"] == "float"


def test_onnxruntime_quantizes_integer_kernel_inputs_outputs_and_biases() -> None:
    annotation = annotate(prepare(conv_bn_residual()), QuantizeConfig(platform="onnxruntime", reduce_range="off"))
    configs = annotation.configs
    for name in annotation.activations:
        assert (configs[name].quant_min, configs[name].quant_max) == (0, 255) and not configs[name].symmetric
    for name in annotation.parameters:
        assert configs[name].symmetric and configs[name].per_channel and configs[name].num_bits == 8
    # Conv → BN(folded) → Relu: the Relu's output is requantized, not the Conv's (the EP drops the Relu)
    assert "r1" in configs and "c1" not in configs and "b1" not in configs
    # r1 feeds conv2 and the residual Add: one tensor, every reader rewired
    assert set(annotation.consumers["r1"]) == {NodeInput("conv2", 0), NodeInput("add", 1)}
    # the Add's output goes to a Relu: requantized after the Relu; Flatten moves codes with r2's scale
    assert "r2" in configs and configs["flat"].dominator == "r2"
    assert "logits" not in configs  # a graph output stays float (QGemm writes float)
    consumers = {link.consumer.node for link in annotation.biases.values()}
    assert consumers == {"conv1", "conv2", "fc"}
    assert all(
        link.activation in configs and link.weight in annotation.parameters for link in annotation.biases.values()
    )
    assert any("full int8 range" in note for note in annotation.notes)


def test_onnxruntime_keeps_float_what_no_integer_kernel_reads() -> None:
    annotation = annotate(prepare(masked_attention()), QuantizeConfig(platform="onnxruntime"))
    decisions, configs = annotation.decisions, annotation.configs
    # the mask and its sum with the scores feed a float Softmax: no integer Add, and no scale spanning -3.4e38
    assert decisions["mask.bias"] == decisions["masked"] == "float"
    assert not {"mask_flat", "mask_bias", "s_scaled", "s_masked"} & set(configs)
    # q·kᵀ and the output projection are read in float (Div, then bias and residual Adds before a
    # LayerNormalization): integer inputs, float output (MatMulIntegerToFloat), and those Adds stay float
    assert decisions["scores"] == decisions["proj"] == "quantized" and {"q", "k_t", "c"} <= set(configs)
    assert not {"s", "o_raw", "o", "h"} & set(configs)
    assert decisions["proj.bias"] == decisions["residual"] == "float"
    # a projection whose biased result goes on to an integer MatMul keeps QLinearMatMul → QLinearAdd
    assert decisions["q.bias"] == "quantized" and {"q_raw", "q"} <= set(configs)


def test_onnxruntime_keeps_convtranspose_float_with_no_integer_kernel_for_it() -> None:
    """The CPU EP runs a ConvTranspose in float whatever Q/DQ surround it: its input and weight stay float (on
    tensorrt, which has an integer kernel, both are quantized), and so does the Relu after it; the MatMul that
    reads the result is quantized as any integer kernel's input."""
    prepared = prepare(matmul_convtranspose())
    annotation = annotate(prepared, QuantizeConfig(platform="onnxruntime"))
    assert annotation.decisions["deconv"] == "float" and not {"input", "deconv.w", "deconv", "relu"} & set(
        annotation.configs
    )
    assert annotation.decisions["matmul"] == "quantized" and {"flat", "mm.w"} <= set(annotation.configs)
    assert {"input", "deconv.w"} <= set(annotate(prepared, QuantizeConfig(platform="tensorrt")).configs)


def test_onnxruntime_dynamic_quantizes_weighted_matmuls_at_run_time() -> None:
    prepared = prepare(masked_attention())
    config = QuantizeConfig(platform="onnxruntime-dynamic")
    annotation = annotate(prepared, config)
    assert {n for n, d in annotation.decisions.items() if d == "quantized"} == {"q", "k", "v", "proj"}
    assert set(annotation.activations) == {"x", "c"} and set(annotation.parameters) == {"Wq", "Wk", "Wv", "Wo"}
    x = annotation.configs["x"]
    assert x.dynamic and not x.symmetric and not x.per_channel and (x.quant_min, x.quant_max) == (0, 255)
    # calibration observes nothing for them: their range is each batch's own at run time
    calibrated = calibrate(prepared, annotation, padded_tokens(8, 12, 8), config)
    assert all(calibrated.configs[n].state is QuantState.ACTIVATED for n in annotation.configs)
    assert calibrated.configs["x"].scale is None and calibrated.configs["Wq"].scale is not None
    # a CNN has no MatMul with a constant weight (its Gemm is not fused with a dynamic input): nothing, said so
    cnn = annotate(prepare(conv_bn_residual()), config)
    assert not cnn.configs and any("found nothing to quantize" in warning for warning in cnn.warnings)


def hard_swish_model() -> onnx.ModelProto:
    """x (N, 4, 6, 6) → Conv "ca" → a; hard swish as paddle2onnx writes it: Add "plus3" (a + 3) → Clip "relu6"
    (0, 6) → Mul "hswish" (a · that) → Div "div6" (/ 6) → h; Conv "tail" → out."""
    rng = np.random.default_rng(5)
    inits = [_init(n, rng.normal(0, 0.5, (4, 4, 1, 1))) for n in ("ca.w", "tail.w")]
    inits += [_init("three", 3.0), _init("zero", 0.0), _init("six", 6.0)]
    nodes = [
        helper.make_node("Conv", ["x", "ca.w"], ["a"], name="ca"),
        helper.make_node("Add", ["a", "three"], ["a3"], name="plus3"),
        helper.make_node("Clip", ["a3", "zero", "six"], ["r6"], name="relu6"),
        helper.make_node("Mul", ["a", "r6"], ["m"], name="hswish"),
        helper.make_node("Div", ["m", "six"], ["h"], name="div6"),
        helper.make_node("Conv", ["h", "tail.w"], ["out"], name="tail"),
    ]
    return _model("hard_swish", nodes, {"x": ["N", 4, 6, 6]}, {"out": None}, inits, 10)


def test_onnxruntime_keeps_uint8_chains_after_an_integer_kernel() -> None:
    annotation = annotate(prepare(hard_swish_model()), QuantizeConfig(platform="onnxruntime"))
    # the Conv writes uint8: the hard swish after it runs on codes (QLinearAdd, Clip, QLinearMul) although
    # a float Div reads its result, since moving bytes rather than floats is the speed
    assert all(annotation.decisions[n] == "quantized" for n in ("ca", "plus3", "relu6", "hswish"))
    assert {"a", "r6", "m", "h"} <= set(annotation.configs)


@pytest.mark.parametrize(
    ("other", "reader", "integer"), [("t", "ReduceMean", False), ("c", "ReduceMean", True), ("t", "Conv", True)]
)
def test_onnxruntime_adds_in_integer_only_what_rounds_nothing_new(other: str, reader: str, integer: bool) -> None:
    # x → Conv "ca" → a (uint8 codes); Conv "cb" → c (codes); Tanh → t (a float result);
    # Add "join"(a, other) → reader. Read in float, the Add is integer only if its other operand needs no
    # new rounding (codes already); read in integer, it is integer whatever its operands
    rng = np.random.default_rng(6)
    inits = [_init(n, rng.normal(0, 0.5, (4, 4, 1, 1))) for n in ("ca.w", "cb.w", "tail.w")]
    nodes = [
        helper.make_node("Conv", ["x", "ca.w"], ["a"], name="ca"),
        helper.make_node("Conv", ["x", "cb.w"], ["c"], name="cb"),
        helper.make_node("Tanh", ["x"], ["t"], name="tanh"),
        helper.make_node("Add", ["a", other], ["j"], name="join"),
        helper.make_node("Conv", ["j", "tail.w"], ["out"], name="tail")
        if reader == "Conv"
        else helper.make_node("ReduceMean", ["j"], ["out"], name="tail", keepdims=0),
    ]
    model = _model("join_after_conv", nodes, {"x": ["N", 4, 6, 6]}, {"out": None}, inits, 10)
    annotation = annotate(prepare(model), QuantizeConfig(platform="onnxruntime"))
    assert annotation.decisions["join"] == ("quantized" if integer else "float")
    assert ("j" in annotation.configs) == integer


@pytest.mark.parametrize(("reader", "integer"), [("Softmax", False), ("Conv", True), ("output", False)])
def test_onnxruntime_concat_is_integer_only_where_an_integer_kernel_reads_it(reader: str, integer: bool) -> None:
    # x → Conv "ca" → a (codes); Where(m, x, -1e4) → w, a masked operand (float); Concat "join"(a, w) →
    # reader. Read in float (a Softmax, the graph's output), QLinearConcat would only round floats
    # (w's -1e4 and a's values on one scale, then dequantized again): the Concat and w stay float.
    rng = np.random.default_rng(7)
    inits = [_init(n, rng.normal(0, 0.5, (4, 4, 1, 1))) for n in ("ca.w", "tail.w")] + [_init("minus", -1e4)]
    nodes = [
        helper.make_node("Conv", ["x", "ca.w"], ["a"], name="ca"),
        helper.make_node("Greater", ["x", "zero"], ["m"], name="mask"),
        helper.make_node("Where", ["m", "x", "minus"], ["w"], name="masked"),
        helper.make_node("Concat", ["a", "w"], ["j"], name="join", axis=1),
    ]
    inits.append(_init("zero", 0.0))
    if reader == "Softmax":
        nodes.append(helper.make_node("Softmax", ["j"], ["out"], name="tail", axis=1))
    elif reader == "Conv":
        inits[1] = _init("tail.w", rng.normal(0, 0.5, (4, 8, 1, 1)))
        nodes.append(helper.make_node("Conv", ["j", "tail.w"], ["out"], name="tail"))
    outputs = {"j": None} if reader == "output" else {"out": None}
    model = _model("masked_join", nodes, {"x": ["N", 4, 6, 6]}, outputs, inits, 10)
    annotation = annotate(prepare(model), QuantizeConfig(platform="onnxruntime"))
    assert annotation.decisions["join"] == ("quantized" if integer else "float")
    assert ({"w", "j"} & set(annotation.configs)) == ({"w", "j"} if integer else set())
    assert "a" in annotation.configs  # the Conv's output: ca is an integer kernel in every case


def test_onnxruntime_closing_sigmoid_and_what_feeds_only_it_stay_float() -> None:
    # logits → Sigmoid → the graph's output: QLinearSigmoid would round the probabilities to 8 bits for
    # no integer reader; the GlobalAveragePool before the Gemm is read in integer, so it keeps its kernel
    annotation = annotate(prepare(depthwise_concat_head()), QuantizeConfig(platform="onnxruntime"))
    assert annotation.decisions["sigmoid"] == "float" and "probs" not in annotation.configs
    assert annotation.reasons["sigmoid"].endswith(
        "no integer kernel reads the result, which its QLinear kernel would round: stays float"
    )
    assert annotation.decisions["gap"] == "quantized" and {"cat", "g"} <= set(annotation.configs)


def _scaled_model(multiplier: list[float]) -> onnx.ModelProto:
    """x (N, 4, 6, 6) → Concat "join"(x, x) → Mul "scale" by a (8, 1, 1) constant → Conv "tail" → out:
    a batch norm's scale that could not be folded into a Conv, as tf2onnx leaves one after a Concat."""
    rng = np.random.default_rng(3)
    inits = [_init("m", np.array(multiplier).reshape(8, 1, 1)), _init("tail.w", rng.normal(0, 0.5, (4, 8, 1, 1)))]
    nodes = [
        helper.make_node("Concat", ["x", "x"], ["j"], name="join", axis=1),
        helper.make_node("Mul", ["j", "m"], ["s"], name="scale"),
        helper.make_node("Conv", ["s", "tail.w"], ["out"], name="tail"),
    ]
    return _model("scaled", nodes, {"x": ["N", 4, 6, 6]}, {"out": None}, inits, 10)


@pytest.mark.parametrize(("spread", "integer"), [(2.0, True), (2.1, False), (60.0, False)])
def test_onnxruntime_mul_by_multipliers_far_apart_keeps_its_input_float(spread: float, integer: bool) -> None:
    # multipliers 0.1 · (1 ... spread): at most 2x apart the Mul (and the Concat feeding it) are
    # integer kernels; further apart, the Mul stays float with the reason, and so does the Concat, whose
    # result no integer kernel reads then; the Mul's product is quantized for the Conv, evened out
    multiplier = list(0.1 * np.geomspace(1.0, spread, 8))
    annotation = annotate(prepare(_scaled_model(multiplier)), QuantizeConfig(platform="onnxruntime"))
    assert annotation.decisions["scale"] == annotation.decisions["join"] == ("quantized" if integer else "float")
    assert ("j" in annotation.configs) == integer and "s" in annotation.configs
    if not integer:
        assert f"multiplier 'm' spans 0.1 to {0.1 * spread:.3g}" in annotation.reasons["scale"]


def test_onnxruntime_reduced_range_gives_7_bit_weights() -> None:
    annotation = annotate(prepare(conv_bn_residual()), QuantizeConfig(platform="onnxruntime", reduce_range="on"))
    for name in annotation.parameters:
        assert annotation.configs[name].num_bits == 7
        assert (annotation.configs[name].quant_min, annotation.configs[name].quant_max) == (-64, 63)
    assert any("[-64, 63]" in note for note in annotation.notes)


def test_academic_first_and_last_layer_at_8_bit() -> None:
    annotation = annotate(prepare(conv_bn_residual()), QuantizeConfig(platform="academic", precision="w4a4"))
    configs = annotation.configs
    assert configs["conv1.w"].num_bits == configs["fc.w"].num_bits == 8  # first and last compute layer
    assert configs["input"].num_bits == configs["flat"].num_bits == 8
    assert configs["conv2.w"].num_bits == 4 and configs["r1"].num_bits == 4
    assert not configs["conv2.w"].symmetric and configs["conv2.w"].per_channel  # asymmetric per-channel
    assert (configs["r1"].quant_min, configs["r1"].quant_max) == (0, 15)
    assert "first/last layer at 8 bit" in annotation.reasons["conv1"]


def test_tensorrt_fp8_configs_are_e4m3() -> None:
    annotation = annotate(prepare(conv_bn_residual()), QuantizeConfig(platform="tensorrt-fp8", precision="fp8"))
    for tqc in annotation.configs.values():
        assert tqc.floating and tqc.exponent_bits == 4 and float(tqc.quant_max) == 448.0
    assert annotation.configs["conv2.w"].per_channel and not annotation.configs["r1"].per_channel
    assert set(annotation.activations) == {"input", "r1", "flat"}  # TensorRT's placement


def test_overrides_set_bits_and_observer_per_node() -> None:
    prepared = prepare(conv_bn_residual())
    config = QuantizeConfig(
        platform="academic",
        precision="w4a4",
        overrides=(
            NodeOverride("conv2", bits=6),
            NodeOverride("conv*", observer="minmax"),
            NodeOverride("conv2", bits=2),
        ),
    )
    annotation = annotate(prepared, config)
    assert annotation.configs["conv2.w"].num_bits == 6  # the first matching override wins
    assert annotation.configs["r1"].num_bits == 6 and annotation.configs["r1"].observer == "minmax"
    assert annotation.configs["flat"].observer == config.observer  # fc matches no override
    assert "6 bit by override 'conv2'" in annotation.reasons["conv2"]
    with pytest.raises(ValueError, match="bits"):
        NodeOverride("x", bits=9)
    with pytest.raises(ValueError, match="observer"):
        NodeOverride("x")


def test_every_decision_has_a_reason() -> None:
    model = attention()
    model.graph.node.append(helper.make_node("Custom", ["out"], ["extra"], name="custom", domain="com.example"))
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    prepared = prepare(model)
    annotation = annotate(prepared, QuantizeConfig(exclude_op_types=("Add",), exclude_node_patterns=("w[qk]",)))
    assert annotation.reasons["residual"] == "excluded by op type Add"
    assert annotation.reasons["wq"] == "excluded by node pattern 'w[qk]'"
    assert "custom-domain op com.example.Custom" in annotation.reasons["custom"]
    assert set(annotation.reasons) == set(annotation.decisions) == {n.name for n in prepared.model.graph.node}
    summary = annotation.summary()
    assert {d["node"] for d in summary["decisions"]} == set(annotation.decisions)
    assert summary["platform"] == "tensorrt"
