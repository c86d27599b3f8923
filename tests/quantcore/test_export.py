"""export: the structure of the QDQ model and of the TQC table."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from quantcore import QuantizeConfig, annotate, calibrate, export, prepare
from tests.quantcore.models import conv_bn_residual, matmul_convtranspose


def quantize_stages(model: onnx.ModelProto, inputs: dict[str, np.ndarray], out_dir, **config):
    config = QuantizeConfig(**config)
    prepared = prepare(model)
    annotation = calibrate(prepared, annotate(prepared, config), inputs, config)
    return annotation, export(prepared, annotation, out_dir, platform=config.platform)


@pytest.fixture
def residual_export(tmp_path):
    model = conv_bn_residual()
    x = np.random.default_rng(0).normal(size=(20, 3, 8, 8)).astype(np.float32)
    annotation, exported = quantize_stages(model, {"input": x}, tmp_path, observer="minmax", batch_size=8)
    return model, annotation, exported, onnx.load(str(exported.model_path))


def test_qdq_node_counts_match_the_annotation(residual_export) -> None:
    _, annotation, exported, qdq = residual_export
    ops = Counter(n.op_type for n in qdq.graph.node)
    # one Q/DQ pair per quantized activation, one DQ per weight (stored as int8)
    assert ops["QuantizeLinear"] == len(annotation.activations) == exported.quantize_linear_nodes == 4
    assert ops["DequantizeLinear"] == len(annotation.activations) + len(annotation.parameters) == 7
    assert ops["BatchNormalization"] == 0  # folded before quantization, so the exported graph has none


def test_interface_and_metadata_are_unchanged(residual_export) -> None:
    model, _, _, qdq = residual_export
    assert [i.name for i in qdq.graph.input] == ["input"] and [o.name for o in qdq.graph.output] == ["logits"]
    assert qdq.graph.input[0].type == model.graph.input[0].type  # dtype and the symbolic batch dim "N"
    assert qdq.graph.output[0].type == model.graph.output[0].type
    assert {p.key: p.value for p in qdq.metadata_props} == {p.key: p.value for p in model.metadata_props}
    assert qdq.producer_name == model.producer_name and qdq.opset_import == model.opset_import
    onnx.checker.check_model(qdq, full_check=True)


def test_weights_are_int8_with_per_channel_dequantize(residual_export) -> None:
    _, annotation, _, qdq = residual_export
    initializers = {t.name: t for t in qdq.graph.initializer}
    for name in annotation.parameters:
        assert name not in initializers  # the float weight is gone
        dq = next(n for n in qdq.graph.node if n.op_type == "DequantizeLinear" and n.name.startswith(name))
        codes, scale, zero = (initializers[i] for i in dq.input)
        assert codes.data_type == onnx.TensorProto.INT8 and zero.data_type == onnx.TensorProto.INT8
        axis = {a.name: helper.get_attribute_value(a) for a in dq.attribute}.get("axis")
        assert axis == annotation.configs[name].channel_axis == 0
        assert list(scale.dims) == [codes.dims[0]]  # (C_out,) scales
        assert np.abs(numpy_helper.to_array(codes)).max() == 127  # amax/127: the largest weight hits ±127


def test_consumers_read_the_dequantized_tensor(residual_export) -> None:
    _, _, _, qdq = residual_export
    nodes = {n.name: n for n in qdq.graph.node}
    producers = {o: n for n in qdq.graph.node for o in n.output}
    for node_name, position in (("conv2", 0), ("add", 0), ("add", 1), ("fc", 0), ("conv1", 0)):
        producer = producers[nodes[node_name].input[position]]
        assert producer.op_type == "DequantizeLinear"
        assert producers[producer.input[0]].op_type == "QuantizeLinear"
    # the Relu that also feeds the residual add still reads and writes float r1
    assert nodes["relu1"].output[0] == "r1"


def test_quantized_tensor_that_is_a_graph_output_stays_float(tmp_path) -> None:
    model = conv_bn_residual()
    model.graph.output.append(helper.make_tensor_value_info("r1", onnx.TensorProto.FLOAT, None))
    x = np.random.default_rng(0).normal(size=(6, 3, 8, 8)).astype(np.float32)
    _, exported = quantize_stages(model, {"input": x}, tmp_path)
    fp32 = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    qdq = ort.InferenceSession(str(exported.model_path), providers=["CPUExecutionProvider"])
    # r1 is computed from the quantized input and weights of conv1, so it differs from FP32 by
    # quantization error only; it must not be the Q/DQ'd (step-rounded) value of itself
    r1_qdq = qdq.run(["r1"], {"input": x})[0]
    r1_fp32 = fp32.run(["r1"], {"input": x})[0]
    assert r1_qdq.shape == r1_fp32.shape
    scale = json.loads(exported.tqc_path.read_text())["tensors"]["r1"]["scale"]
    codes = r1_qdq / scale
    assert not np.allclose(codes, np.round(codes), atol=1e-3)  # not snapped to the quantization grid


def test_tqc_table(residual_export) -> None:
    _, annotation, exported, _ = residual_export
    table = json.loads(exported.tqc_path.read_text())
    assert table["format"] == "quantcore.tqc/1" and table["platform"] == "tensorrt"
    assert set(table["tensors"]) == set(annotation.configs)
    weight = table["tensors"]["conv2.w"]
    assert weight["kind"] == "weight" and weight["state"] == "baked" and weight["axis"] == 0
    assert len(weight["scale"]) == 4 and weight["offset"] == [0, 0, 0, 0] and weight["bits"] == 8
    activation = table["tensors"]["r1"]
    assert activation["kind"] == "activation" and activation["state"] == "activated"
    assert isinstance(activation["scale"], float) and activation["observer"] == "minmax"
    assert {(c["node"], c["input"]) for c in activation["consumers"]} == {("conv2", 0), ("add", 1)}


def test_matmul_and_convtranspose_export_runs_in_onnxruntime(tmp_path) -> None:
    model = matmul_convtranspose()
    x = np.random.default_rng(0).normal(size=(4, 4, 5, 5)).astype(np.float32)
    _, exported = quantize_stages(model, {"input": x}, tmp_path, observer="minmax")
    qdq = onnx.load(str(exported.model_path))
    onnx.checker.check_model(qdq, full_check=True)
    axes = {
        n.input[0]: {a.name: helper.get_attribute_value(a) for a in n.attribute}.get("axis")
        for n in qdq.graph.node
        if n.op_type == "DequantizeLinear"
    }
    assert axes["deconv.w_quantized"] == 1 and axes["mm.w_quantized"] == 1
    fp32 = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"input": x})
    for disable in ("0", "1"):
        options = ort.SessionOptions()
        options.add_session_config_entry("session.disable_quant_qdq", disable)
        out = ort.InferenceSession(str(exported.model_path), options, providers=["CPUExecutionProvider"]).run(
            None, {"input": x}
        )
        # 8-bit error on a 3-layer net: outputs agree to well within 10% of their range
        assert np.abs(out[0] - fp32[0]).max() <= 0.1 * np.abs(fp32[0]).max()
