"""qdq_rules: each rule fires on a graph built to break it and stays silent on a correct QDQ graph,
and the models the current pipeline exports carry no error-severity findings."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quantcore
from quantcore.runtime.session import open_session
from quantcore.tensorrt.qdq_rules import RULES, Finding, check_qdq, summarize
from tests.quantcore.models import conv_bn_residual, conv_relu_gemm, matmul_convtranspose, save

RNG = np.random.default_rng(0)


class Parts:
    """Nodes, initializers and outputs of a hand-built QDQ graph, editable before assembly."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: dict[str, onnx.TensorProto] = {}
        self.outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 3])]
        self.opset = 21

    def init(self, name: str, array: np.ndarray) -> str:
        self.inits[name] = numpy_helper.from_array(np.asarray(array), name)
        return name

    def qdq(self, tensor: str, scale: float = 0.05, *, zero=np.int8(0)) -> str:
        """Per-tensor Q/DQ of an activation; returns the dequantized name."""
        self.init(f"{tensor}.s", np.float32(scale))
        self.init(f"{tensor}.z", zero)
        self.nodes.append(
            helper.make_node(
                "QuantizeLinear", [tensor, f"{tensor}.s", f"{tensor}.z"], [f"{tensor}.q"], name=f"{tensor}.Q"
            )
        )
        self.nodes.append(
            helper.make_node(
                "DequantizeLinear", [f"{tensor}.q", f"{tensor}.s", f"{tensor}.z"], [f"{tensor}.dq"], name=f"{tensor}.DQ"
            )
        )
        return f"{tensor}.dq"

    def weight(self, name: str, w: np.ndarray, axis: int) -> str:
        """Per-channel symmetric int8 weight on ``axis`` behind a DQ; returns the dequantized name."""
        reduce = tuple(a for a in range(w.ndim) if a != axis)
        scale = (np.abs(w).max(axis=reduce) / 127).astype(np.float32)
        shape = [1] * w.ndim
        shape[axis] = -1
        codes = np.clip(np.round(w / scale.reshape(shape)), -127, 127).astype(np.int8)
        self.init(f"{name}.codes", codes)
        self.init(f"{name}.s", scale)
        self.init(f"{name}.z", np.zeros(scale.shape, np.int8))
        self.nodes.append(
            helper.make_node(
                "DequantizeLinear",
                [f"{name}.codes", f"{name}.s", f"{name}.z"],
                [f"{name}.dq"],
                name=f"{name}.DQ",
                axis=axis,
            )
        )
        return f"{name}.dq"

    def node(self, name: str) -> onnx.NodeProto:
        return next(n for n in self.nodes if n.name == name)

    def model(self) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes,
            "qdq",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
            self.outputs,
            list(self.inits.values()),
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)], ir_version=10)


def good_parts() -> Parts:
    """x → Q/DQ → Conv(W1 per-channel axis 0) → Relu → Q/DQ → Conv(W2) → Q/DQ → Add(residual, both
    inputs dequantized) → Flatten → Q/DQ → Gemm(transB=1, axis 0) → Q/DQ → MatMul(W (5, 3), axis 1) → out."""
    p = Parts()
    x = p.qdq("x")
    p.init("b1", RNG.normal(0, 0.1, 4).astype(np.float32))
    p.nodes.append(
        helper.make_node(
            "Conv",
            [x, p.weight("w1", RNG.normal(0, 0.3, (4, 3, 3, 3)), 0), "b1"],
            ["c1"],
            name="conv1",
            pads=[1, 1, 1, 1],
        )
    )
    p.nodes.append(helper.make_node("Relu", ["c1"], ["r1"], name="relu1"))
    r1 = p.qdq("r1")
    p.nodes.append(
        helper.make_node(
            "Conv", [r1, p.weight("w2", RNG.normal(0, 0.3, (4, 4, 3, 3)), 0)], ["c2"], name="conv2", pads=[1, 1, 1, 1]
        )
    )
    c2 = p.qdq("c2")
    p.nodes.append(helper.make_node("Add", [c2, r1], ["sum"], name="add"))
    p.nodes.append(helper.make_node("Flatten", ["sum"], ["flat"], name="flatten"))
    flat = p.qdq("flat")
    p.nodes.append(
        helper.make_node(
            "Gemm", [flat, p.weight("wfc", RNG.normal(0, 0.1, (5, 256)), 0)], ["logits"], name="fc", transB=1
        )
    )
    logits = p.qdq("logits")
    p.nodes.append(
        helper.make_node("MatMul", [logits, p.weight("wm", RNG.normal(0, 0.3, (5, 3)), 1)], ["out"], name="matmul")
    )
    return p


def _reading_quantized(p: Parts) -> None:  # Add reads the int8 Q output instead of its DQ
    p.node("add").input[0] = "c2.q"


def _uint8_zero(p: Parts) -> None:
    p.init("x.z", np.uint8(0))


def _nonzero_zero(p: Parts) -> None:
    p.init("r1.z", np.int8(3))


def _negative_scale(p: Parts) -> None:
    p.init("r1.s", np.float32(-0.05))


def _nan_scale(p: Parts) -> None:
    p.init("c2.s", np.float32("nan"))


def _per_channel_activation(p: Parts) -> None:
    p.init("r1.s", np.full(4, 0.05, np.float32))
    p.init("r1.z", np.zeros(4, np.int8))
    for name in ("r1.Q", "r1.DQ"):
        p.node(name).attribute.append(helper.make_attribute("axis", 1))


def _conv_weight_axis(p: Parts) -> None:  # W1 (4, 3, 3, 3): per-channel on the input-channel axis
    dq = p.node("w1.DQ")
    del dq.attribute[:]
    dq.attribute.append(helper.make_attribute("axis", 1))


def _matmul_weight_axis(p: Parts) -> None:  # MatMul B (5, 3): scales on axis 0 (the reduced axis)
    w = numpy_helper.to_array(p.inits["wm.codes"]).astype(np.float32)
    p.init("wm.s", np.full(5, 0.01, np.float32))
    p.init("wm.z", np.zeros(5, np.int8))
    p.init("wm.codes", w.astype(np.int8))
    dq = p.node("wm.DQ")
    del dq.attribute[:]
    dq.attribute.append(helper.make_attribute("axis", 0))


def _int4_activation(p: Parts) -> None:
    p.inits["flat.z"] = helper.make_tensor("flat.z", TensorProto.INT4, [], [0])


def _mismatched_pair(p: Parts) -> None:
    p.init("r1.s2", np.float32(0.07))
    p.node("r1.DQ").input[1] = "r1.s2"


def _softmax_only(p: Parts) -> None:  # a Q/DQ pair whose only reader is a Softmax
    p.nodes.append(helper.make_node("Softmax", [p.qdq("out")], ["probs"], name="softmax", axis=-1))
    p.outputs.append(helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 3]))


def _float_conv_input(p: Parts) -> None:  # conv2's weight is dequantized, its activation is float
    p.node("conv2").input[0] = "r1"


BAD_CASES: dict[str, list[Callable[[Parts], None]]] = {
    "q_dq_pair": [_reading_quantized],
    "storage_type": [_uint8_zero],
    "zero_offset": [_nonzero_zero],
    "scale": [_negative_scale, _nan_scale],
    "activation_granularity": [_per_channel_activation],
    "weight_axis": [_conv_weight_axis, _matmul_weight_axis],
    "int4_weight_only": [_int4_activation],
    "pair_mismatch": [_mismatched_pair],
    "unfusable": [_softmax_only],
    "partial_inputs": [_float_conv_input],
}


def test_every_rule_has_a_bad_case() -> None:
    assert set(BAD_CASES) == set(RULES)


def test_good_graph_is_valid_and_has_no_findings() -> None:
    model = good_parts().model()
    onnx.checker.check_model(model, full_check=True)
    with open_session(model, exact_qdq=True) as session:  # a real, runnable QDQ model
        (out,) = session.run(None, {"x": RNG.normal(size=(2, 3, 8, 8)).astype(np.float32)})
    assert out.shape == (2, 3)
    assert check_qdq(model) == []


@pytest.mark.parametrize(
    ("rule", "mutate"),
    [(rule, m) for rule, ms in BAD_CASES.items() for m in ms],
    ids=lambda v: getattr(v, "__name__", v),
)
def test_rule_fires_on_its_bad_case(rule: str, mutate: Callable[[Parts], None]) -> None:
    parts = good_parts()
    mutate(parts)
    findings = check_qdq(parts.model())
    fired = [f for f in findings if f.rule == rule]
    assert fired, f"{rule} did not fire; findings: {[f.to_dict() for f in findings]}"
    finding = fired[0]
    assert finding.severity in ("error", "warning") and finding.node and finding.tensor and finding.message


def test_findings_are_structured_records() -> None:
    parts = good_parts()
    _nonzero_zero(parts)
    summary = summarize(check_qdq(parts.model()))
    # The zero point is shared by the pair, so both Q and DQ are reported, at the same tensor.
    assert summary["errors"] == 2 and summary["warnings"] == 0
    assert {f["node"] for f in summary["findings"]} == {"r1.Q", "r1.DQ"}
    for record in summary["findings"]:
        assert set(record) == {"rule", "node", "tensor", "message", "severity"}
        assert (record["rule"], record["tensor"], record["severity"]) == ("zero_offset", "r1.z", "error")
        assert "offset 0" in record["message"]
    with pytest.raises(ValueError, match="severity"):
        Finding(rule="scale", node="n", tensor="t", message="m", severity="fatal")
    with pytest.raises(ValueError, match="rule"):
        Finding(rule="nope", node="n", tensor="t", message="m", severity="error")


@pytest.mark.parametrize(
    "build",
    [conv_bn_residual, matmul_convtranspose, conv_relu_gemm, lambda: conv_relu_gemm(transB=0)],
    ids=["conv_bn_residual", "matmul_convtranspose", "gemm_transB1", "gemm_transB0"],
)
def test_pipeline_exports_follow_the_rules(build, tmp_path) -> None:
    model = build()
    path = save(model, tmp_path / "model.onnx")
    dims = [d.dim_value or 8 for d in model.graph.input[0].type.tensor_type.shape.dim]
    data = {model.graph.input[0].name: RNG.normal(size=[24, *dims[1:]]).astype(np.float32)}
    result = quantcore.quantize(path, data, data, quantcore.QuantizeConfig(platform="tensorrt"), tmp_path / "out")
    findings = check_qdq(result.model_path)
    assert [f.to_dict() for f in findings if f.severity == "error"] == []
    # The tensorrt platform places Q/DQ only where TensorRT fuses them: no warnings either.
    assert [f.to_dict() for f in findings] == []


def _export(build, tmp_path, config: quantcore.QuantizeConfig):
    model = build()
    path = save(model, tmp_path / "model.onnx")
    dims = [d.dim_value or 8 for d in model.graph.input[0].type.tensor_type.shape.dim]
    data = {model.graph.input[0].name: RNG.normal(size=[16, *dims[1:]]).astype(np.float32)}
    return quantcore.quantize(path, data, data, config, tmp_path / "out").model_path


def test_fp8_export_follows_the_rules(tmp_path) -> None:
    config = quantcore.QuantizeConfig(platform="tensorrt-fp8", precision="fp8")
    assert check_qdq(_export(conv_bn_residual, tmp_path, config)) == []


def test_onnxruntime_platform_export_is_not_a_tensorrt_model(tmp_path) -> None:
    """The onnxruntime platform's asymmetric uint8 activations are exactly what TensorRT refuses."""
    findings = check_qdq(_export(conv_bn_residual, tmp_path, quantcore.QuantizeConfig(platform="onnxruntime")))
    errors = {f.rule for f in findings if f.severity == "error"}
    assert {"storage_type", "zero_offset"} <= errors
    assert all(f.node.endswith(("QuantizeLinear", "DequantizeLinear")) for f in findings)


def test_convtranspose_weight_on_axis_0_is_refused(tmp_path) -> None:
    path = _export(matmul_convtranspose, tmp_path, quantcore.QuantizeConfig(platform="tensorrt"))
    model = onnx.load(str(path))
    assert check_qdq(model) == []  # exported on axis 1, the output-channel axis of (C_in, C_out, kH, kW)
    dq = next(n for n in model.graph.node if n.name == "deconv.w_DequantizeLinear")
    next(a for a in dq.attribute if a.name == "axis").i = 0
    (finding,) = check_qdq(model)
    assert (finding.rule, finding.tensor, finding.severity) == ("weight_axis", "deconv.w_quantized", "error")
    assert "ConvTranspose" in finding.message and "is 1" in finding.message
