"""annotate: the TensorRT rule table, exclusions, shared tensors."""

from __future__ import annotations

from quantcore import QuantizeConfig, annotate, prepare
from quantcore.annotate.annotation import NodeInput
from tests.quantcore.models import conv_bn_residual, conv_relu_gemm, matmul_convtranspose


def test_conv_gemm_and_residual_add() -> None:
    annotation = annotate(prepare(conv_bn_residual()), QuantizeConfig(observer="minmax"))
    configs = annotation.configs
    # activations: conv1 input, conv2 input (r1, also the residual branch), fc input; the Add's other
    # input b2 is conv2's output, which TensorRT fuses the sum into: not quantized
    assert set(annotation.activations) == {"input", "r1", "flat"}
    assert set(annotation.parameters) == {"conv1.w", "conv2.w", "fc.w"}
    for name in annotation.activations:
        assert not configs[name].per_channel and configs[name].symmetric and configs[name].observer == "minmax"
    # weights: per-channel on the output-channel axis (Conv: 0; Gemm transB=1: 0)
    for name in ("conv1.w", "conv2.w", "fc.w"):
        assert configs[name].per_channel and configs[name].channel_axis == 0
    # r1 feeds conv2 and the residual Add: one config, both consumers rewired
    assert set(annotation.consumers["r1"]) == {NodeInput("conv2", 0), NodeInput("add", 1)}
    assert annotation.decisions["add"] == "quantized"
    assert annotation.decisions["relu1"] == "pass_through"
    # biases stay float
    assert not {"conv1.b", "fc.b"} & set(configs)


def test_gemm_without_transpose_uses_axis_1() -> None:
    annotation = annotate(prepare(conv_relu_gemm(transB=0)), QuantizeConfig())
    assert annotation.configs["fc.w"].channel_axis == 1  # B is (K, N): N is axis 1


def test_matmul_and_convtranspose_axes_and_bias_add_stays_float() -> None:
    annotation = annotate(prepare(matmul_convtranspose()), QuantizeConfig())
    assert annotation.configs["deconv.w"].channel_axis == 1  # (C_in, C_out, kH, kW)
    assert annotation.configs["mm.w"].channel_axis == 1  # (K, N)
    assert annotation.decisions["bias_add"] == "float"  # Add with a constant input is not a residual
    assert "mm.b" not in annotation.configs and "mm" not in annotation.configs


def test_exclusion_by_op_type_and_by_name_pattern() -> None:
    prepared = prepare(conv_bn_residual())
    by_type = annotate(prepared, QuantizeConfig(exclude_op_types=("Gemm",)))
    assert by_type.decisions["fc"] == "excluded"
    assert "fc.w" not in by_type.configs and "flat" not in by_type.configs
    by_name = annotate(prepared, QuantizeConfig(exclude_node_patterns=("conv*",)))
    assert by_name.decisions["conv1"] == by_name.decisions["conv2"] == "excluded"
    assert set(by_name.parameters) == {"fc.w"}
    # r1 is still quantized for the Add, and only the Add reads the quantized value
    assert by_name.consumers["r1"] == (NodeInput("add", 1),)


def test_observer_comes_from_config() -> None:
    annotation = annotate(prepare(conv_relu_gemm()), QuantizeConfig(observer="percentile"))
    assert annotation.configs["input"].observer == "percentile"
    assert annotation.configs["w"].observer == "minmax"  # weights always use their exact range
