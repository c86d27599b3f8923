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
from tests.quantcore.models import conv_bn_residual, masked_attention, matmul_convtranspose, padded_tokens


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
    # one Q/DQ pair per quantized activation (input, r1, flat: the Add's other input is conv2's output,
    # which TensorRT fuses the sum into), one DQ per weight (stored as int8)
    assert ops["QuantizeLinear"] == len(annotation.activations) == exported.quantize_linear_nodes == 3
    assert ops["DequantizeLinear"] == len(annotation.activations) + len(annotation.parameters) == 6
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
    for node_name, position in (("conv2", 0), ("add", 1), ("fc", 0), ("conv1", 0)):
        producer = producers[nodes[node_name].input[position]]
        assert producer.op_type == "DequantizeLinear"
        assert producers[producer.input[0]].op_type == "QuantizeLinear"
    assert producers[nodes["add"].input[0]].name == "conv2"  # the sum TensorRT fuses into conv2 reads it float
    # the Relu that also feeds the residual add still reads and writes float r1
    assert nodes["relu1"].output[0] == "r1"


def test_quantized_tensor_that_is_a_graph_output_stays_float(tmp_path) -> None:
    model = conv_bn_residual()
    model.graph.output.append(helper.make_tensor_value_info("r1", onnx.TensorProto.FLOAT, ["N", 4, 8, 8]))
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
    assert table["format"] == "quantcore.tqc/2" and table["platform"] == "tensorrt"
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


@pytest.mark.parametrize("platform", ["onnxruntime", "onnxruntime-dynamic", "tensorrt"])
def test_masked_attention_keeps_its_accuracy(tmp_path, platform: str) -> None:
    # padded tokens get -3.4e38 added to their scores before the Softmax. At int8, this block measures
    # about 35 dB against FP32 on either platform; quantizing the masked sum (as onnxruntime rules that
    # give every Add of two float tensors an integer kernel would) puts -3.4e38 and the scores on one
    # scale: 9.9 dB. 28 dB separates the two with room for another seed's noise.
    model = masked_attention()
    _, exported = quantize_stages(model, padded_tokens(64, 12, 8, seed=0), tmp_path, platform=platform, batch_size=8)
    held_out = padded_tokens(64, 12, 8, seed=1)
    (reference,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, held_out
    )
    session = ort.InferenceSession(str(exported.model_path), providers=["CPUExecutionProvider"])
    (quantized,) = session.run(None, held_out)
    sqnr = 10 * np.log10(np.sum(reference**2) / np.sum((reference - quantized) ** 2))
    assert sqnr > 28.0, f"{platform}: {sqnr:.1f} dB"


def test_onnxruntime_dynamic_runs_as_dynamic_quantize_matmul(tmp_path) -> None:
    """The dynamic platform's whole point: ONNX Runtime fuses its DynamicQuantizeLinear → DequantizeLinear →
    MatMul ← DequantizeLinear(int8 weights) into DynamicQuantizeMatMul / MatMulIntegerToFloat, for the four
    projections of the attention block; the two MatMuls of activations stay float."""
    annotation, exported = quantize_stages(
        masked_attention(), padded_tokens(16, 12, 8), tmp_path, platform="onnxruntime-dynamic", batch_size=8
    )
    qdq = onnx.load(str(exported.model_path))
    ops = Counter(n.op_type for n in qdq.graph.node)
    # x read by q, k and v: one quantizer; the context read by proj: the other
    assert ops["DynamicQuantizeLinear"] == exported.quantize_linear_nodes == 2 and ops["QuantizeLinear"] == 0
    assert all(annotation.configs[name].dynamic for name in annotation.activations)
    assert {annotation.configs[name].channel_axis for name in annotation.parameters} == {1}
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(exported.model_path), options, providers=["CPUExecutionProvider"])
    optimized = Counter(n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node)
    assert optimized["DynamicQuantizeMatMul"] + optimized["MatMulIntegerToFloat"] == 4, optimized
    # q·kᵀ becomes a FusedMatMul (the Transpose and the scaling folded in), p·v stays a MatMul
    assert optimized["MatMul"] + optimized["FusedMatMul"] == 2 and optimized["DequantizeLinear"] == 0, optimized


def _initializers(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in model.graph.initializer}


def _opset(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def test_int8_export_keeps_the_opset(residual_export) -> None:
    model, _, exported, qdq = residual_export
    assert _opset(qdq) == _opset(model) == exported.opset == 17  # per-channel int8 needs 13 only


def test_onnxruntime_export_types_and_int32_biases(tmp_path) -> None:
    x = np.random.default_rng(0).normal(size=(16, 3, 8, 8)).astype(np.float32)
    annotation, exported = quantize_stages(
        conv_bn_residual(), {"input": x}, tmp_path, platform="onnxruntime", observer="minmax", reduce_range="off"
    )
    qdq = onnx.load(str(exported.model_path))
    initializers = _initializers(qdq)
    for node in qdq.graph.node:
        if node.op_type == "QuantizeLinear":  # activations: uint8 with a zero point
            assert initializers[node.input[2]].data_type == onnx.TensorProto.UINT8
    assert annotation.biases
    for bias, link in annotation.biases.items():
        dq = next(n for n in qdq.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == f"{bias}_dequantized")
        codes, scale, zero = (initializers[i] for i in dq.input)
        assert codes.data_type == zero.data_type == onnx.TensorProto.INT32
        expected = annotation.configs[link.activation].scale * annotation.configs[link.weight].scale
        np.testing.assert_array_equal(numpy_helper.to_array(scale), expected.astype(np.float32))  # s_x · s_w[c]
    table = json.loads(exported.tqc_path.read_text())
    assert set(table["biases"]) == set(annotation.biases) and table["platform"] == "onnxruntime"
    fp32 = ort.InferenceSession(conv_bn_residual().SerializeToString(), providers=["CPUExecutionProvider"])
    reference = fp32.run(None, {"input": x})[0]
    out = ort.InferenceSession(str(exported.model_path), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    assert np.abs(out - reference).max() <= 0.1 * np.abs(reference).max()  # 8-bit error on a 3-layer net


def test_academic_4_bit_export_uses_int4_at_opset_21(tmp_path) -> None:
    x = np.random.default_rng(0).normal(size=(16, 3, 8, 8)).astype(np.float32)
    config = {"platform": "academic", "precision": "w4a4", "observer": "minmax"}
    _, exported = quantize_stages(conv_bn_residual(), {"input": x}, tmp_path, **config)
    qdq = onnx.load(str(exported.model_path))
    assert _opset(qdq) == exported.opset == 21 and qdq.ir_version >= 10  # int4 Q/DQ needs opset 21
    initializers = _initializers(qdq)
    types = {
        node.input[0].removesuffix("_quantized"): initializers[node.input[2]].data_type
        for node in qdq.graph.node
        if node.op_type == "DequantizeLinear"
    }
    assert types["conv2.w"] == onnx.TensorProto.UINT4  # 4-bit asymmetric weight
    assert types["r1"] == onnx.TensorProto.UINT4  # 4-bit asymmetric activation
    assert types["conv1.w"] == onnx.TensorProto.UINT8  # first layer at 8 bit
    assert [i.name for i in qdq.graph.input] == ["input"] and [o.name for o in qdq.graph.output] == ["logits"]
    model = conv_bn_residual()  # raising the opset keeps the interface and the metadata
    assert (
        qdq.graph.input[0].type == model.graph.input[0].type and qdq.graph.output[0].type == model.graph.output[0].type
    )
    assert {p.key: p.value for p in qdq.metadata_props} == {p.key: p.value for p in model.metadata_props}
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    out = ort.InferenceSession(str(exported.model_path), options, providers=["CPUExecutionProvider"]).run(
        None, {"input": x}
    )[0]
    assert np.isfinite(out).all()


def test_narrow_activation_range_is_clipped_before_quantize(tmp_path) -> None:
    x = np.random.default_rng(0).normal(size=(16, 3, 8, 8)).astype(np.float32)
    config = {"platform": "academic", "precision": "w3a3", "observer": "minmax"}
    annotation, exported = quantize_stages(conv_bn_residual(), {"input": x}, tmp_path, **config)
    qdq = onnx.load(str(exported.model_path))
    initializers = _initializers(qdq)
    tqc = annotation.configs["r1"]  # 3-bit asymmetric: [0, 7] stored in uint4 [0, 15]
    assert (tqc.quant_min, tqc.quant_max) == (0, 7)
    clip = next(n for n in qdq.graph.node if n.op_type == "Clip" and n.input[0] == "r1")
    lo, hi = (float(numpy_helper.to_array(initializers[i])) for i in clip.input[1:])
    scale, offset = float(tqc.scale), int(tqc.offset)
    assert lo == pytest.approx((0 - offset) * scale) and hi == pytest.approx((7 - offset) * scale)
    q = next(n for n in qdq.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == clip.output[0])
    assert q is not None
    codes = [n for n in qdq.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == "conv2.w_quantized"]
    assert len(codes) == 1  # weights: the stored codes already respect [0, 7], no Clip needed


def test_fp8_export_stores_float8_e4m3(tmp_path) -> None:
    x = np.random.default_rng(0).normal(size=(16, 3, 8, 8)).astype(np.float32)
    config = {"platform": "tensorrt-fp8", "precision": "fp8", "observer": "minmax"}
    _, exported = quantize_stages(conv_bn_residual(), {"input": x}, tmp_path, **config)
    qdq = onnx.load(str(exported.model_path))
    assert _opset(qdq) == 19  # float8 Q/DQ
    initializers = _initializers(qdq)
    for node in qdq.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            assert initializers[node.input[2]].data_type == onnx.TensorProto.FLOAT8E4M3FN
    codes = initializers["conv2.w_quantized"]
    assert codes.data_type == onnx.TensorProto.FLOAT8E4M3FN
    table = json.loads(exported.tqc_path.read_text())
    assert table["tensors"]["conv2.w"]["storage"] == "float8e4m3fn"
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    out = ort.InferenceSession(str(exported.model_path), options, providers=["CPUExecutionProvider"]).run(
        None, {"input": x}
    )[0]
    reference = ort.InferenceSession(conv_bn_residual().SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"input": x}
    )[0]
    assert np.abs(out - reference).max() <= 0.15 * np.abs(reference).max()  # E4M3: 3 mantissa bits


def test_export_of_a_model_saved_with_external_data(tmp_path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    onnx.save_model(
        conv_bn_residual(),
        str(model_dir / "m.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="m.onnx.data",
        size_threshold=0,
    )
    prepared = prepare(model_dir / "m.onnx")
    config = QuantizeConfig(platform="onnxruntime", observer="minmax")
    x = np.random.default_rng(0).normal(size=(4, 3, 8, 8)).astype(np.float32)
    annotation = calibrate(prepared, annotate(prepared, config), {"input": x}, config)
    exported = export(prepared, annotation, tmp_path / "out")
    qdq = onnx.load(str(exported.model_path))  # weights come back inline (small model): self-contained
    assert all(t.data_location != onnx.TensorProto.EXTERNAL for t in qdq.graph.initializer)
    assert ort.InferenceSession(str(exported.model_path), providers=["CPUExecutionProvider"]).run(None, {"input": x})


def test_beyond_the_protobuf_limit_the_export_uses_external_data(tmp_path, monkeypatch) -> None:
    """The >2 GB path, exercised by lowering the limit: tensors go to model.qdq.onnx.data, the checker
    reads the model from disk, and ONNX Runtime runs it from its directory."""
    import quantcore.graph.protobuf

    monkeypatch.setattr(quantcore.graph.protobuf, "PROTOBUF_LIMIT", 1000)
    x = np.random.default_rng(0).normal(size=(4, 3, 8, 8)).astype(np.float32)
    _, exported = quantize_stages(conv_bn_residual(), {"input": x}, tmp_path, platform="onnxruntime")
    assert {p.name for p in exported.files} == {"model.qdq.onnx", "model.qdq.onnx.data", "tqc.json"}
    header = onnx.load(str(exported.model_path), load_external_data=False)
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in header.graph.initializer)
    reference = ort.InferenceSession(conv_bn_residual().SerializeToString(), providers=["CPUExecutionProvider"])
    out = ort.InferenceSession(str(exported.model_path), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    expected = reference.run(None, {"input": x})[0]
    assert np.abs(out - expected).max() <= 0.1 * np.abs(expected).max()
