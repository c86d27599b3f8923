"""inspect_model: upload validation with human-readable reasons, and the model description."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from quantcore import InvalidModelError, inspect_model
from quantcore.runtime.batching import input_specs
from samples.tiny import stateful_model
from tests.quantcore.models import conv_bn_residual, conv_relu_gemm, save


def test_describes_a_valid_model(tmp_path) -> None:
    model = conv_bn_residual()
    # old-style model listing an initializer as a graph input: it is not a real input
    model.graph.input.append(helper.make_tensor_value_info("fc.b", onnx.TensorProto.FLOAT, [5]))
    info = inspect_model(save(model, tmp_path / "m.onnx"), min_opset=13, max_opset=21)
    assert info["opset"] == 17 and info["ir_version"] == 8 and info["producer"] == "tests"
    assert info["inputs"] == [{"name": "input", "dtype": "float32", "shape": ["N", 3, 8, 8], "batch_axis": 0}]
    assert info["outputs"] == [{"name": "logits", "dtype": "float32", "shape": ["N", 5]}]
    assert info["op_histogram"] == {"Add": 1, "BatchNormalization": 2, "Conv": 2, "Flatten": 1, "Gemm": 1, "Relu": 2}
    assert info["num_nodes"] == 9
    expected_parameters = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    assert info["num_parameters"] == expected_parameters
    json.dumps(info, allow_nan=False)  # plain JSON values only


def test_unknown_dimension_is_null(tmp_path) -> None:
    model = conv_relu_gemm()
    model.graph.input[0].type.tensor_type.shape.dim[0].Clear()
    info = inspect_model(save(model, tmp_path / "m.onnx"))
    assert info["inputs"][0]["shape"] == [None, 2, 6, 6]


def test_records_each_inputs_batch_axis(tmp_path) -> None:
    # quantcore.runtime.batching's rule, recorded for the service: state (2, batch, 8) along axis 1, sr constant
    info = inspect_model(save(stateful_model(), tmp_path / "m.onnx"))
    assert [(i["name"], i["batch_axis"]) for i in info["inputs"]] == [("x", 0), ("state", 1), ("sr", None)]
    assert [i["batch_axis"] for i in info["inputs"]] == [s.batch_axis for s in input_specs(stateful_model())]


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.9, -1])
def test_truncated_file(tmp_path, keep: float) -> None:
    data = conv_bn_residual().SerializeToString()
    path = tmp_path / "m.onnx"
    path.write_bytes(data[: int(len(data) * keep)] if keep > 0 else data[:-1])
    with pytest.raises(InvalidModelError, match=r"not a valid ONNX|checker|no graph|truncated"):
        inspect_model(path)


def test_random_bytes(tmp_path) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(InvalidModelError, match="not a valid ONNX"):
        inspect_model(path)


def test_empty_and_missing_files(tmp_path) -> None:
    (tmp_path / "empty.onnx").write_bytes(b"")
    with pytest.raises(InvalidModelError, match="empty"):
        inspect_model(tmp_path / "empty.onnx")
    with pytest.raises(InvalidModelError, match="not found"):
        inspect_model(tmp_path / "missing.onnx")


@pytest.mark.parametrize(("opset", "bounds"), [(17, (7, 16)), (11, (13, 21))])
def test_opset_out_of_range(tmp_path, opset: int, bounds: tuple[int, int]) -> None:
    model = conv_relu_gemm()
    model.opset_import[0].version = opset
    with pytest.raises(InvalidModelError, match=f"opset {opset} is outside the supported range"):
        inspect_model(save(model, tmp_path / "m.onnx"), min_opset=bounds[0], max_opset=bounds[1])


def test_checker_failure_is_reported(tmp_path) -> None:
    model = conv_relu_gemm()
    model.graph.node[0].input[0] = "nowhere"  # reads a tensor nothing produces
    with pytest.raises(InvalidModelError, match="checker"):
        inspect_model(save(model, tmp_path / "m.onnx"))


def _with_external_weight(directory, location: str) -> str:
    """Save a model whose 'w' initializer points at external data ``location``."""
    model = conv_relu_gemm()
    tensor = next(t for t in model.graph.initializer if t.name == "w")
    raw = numpy_helper.to_array(tensor).tobytes()
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(len(raw)))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    path = directory / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return str(path), raw


def test_external_data_inside_the_directory_is_accepted(tmp_path) -> None:
    path, raw = _with_external_weight(tmp_path, "weights/w.bin")
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "w.bin").write_bytes(raw)
    assert inspect_model(path)["num_parameters"] > 0


@pytest.mark.parametrize(
    ("location", "reason"),
    [
        ("../secret.bin", "leaves the model's directory"),
        ("sub/../../secret.bin", "leaves the model's directory"),
        ("/etc/passwd", "absolute path"),
        ("C:\\secret.bin", "absolute path"),
        ("missing.bin", "missing"),
    ],
)
def test_external_data_escaping_the_directory_is_refused(tmp_path, location: str, reason: str) -> None:
    model_dir = tmp_path / "upload"
    model_dir.mkdir()
    path, raw = _with_external_weight(model_dir, location)
    (tmp_path / "secret.bin").write_bytes(raw)  # exists, so only the location rule can refuse it
    with pytest.raises(InvalidModelError, match=reason):
        inspect_model(path)


def test_external_data_through_a_symlink_out_of_the_directory_is_refused(tmp_path) -> None:
    model_dir = tmp_path / "upload"
    model_dir.mkdir()
    path, raw = _with_external_weight(model_dir, "link.bin")
    (tmp_path / "secret.bin").write_bytes(raw)
    (model_dir / "link.bin").symlink_to(tmp_path / "secret.bin")
    with pytest.raises(InvalidModelError, match="resolves outside"):
        inspect_model(path)


def test_external_data_range_past_the_end_is_refused(tmp_path) -> None:
    path, raw = _with_external_weight(tmp_path, "w.bin")
    (tmp_path / "w.bin").write_bytes(raw[:-4])
    with pytest.raises(InvalidModelError, match="exceeds"):
        inspect_model(path)


def test_a_model_uploaded_without_its_weights_file_is_told_how_to_make_one_file(tmp_path) -> None:
    """What torch.onnx.export(..., dynamo=True) writes by default, model.onnx and model.onnx.data, with
    only model.onnx uploaded."""
    path, raw = _with_external_weight(tmp_path, "m.onnx.data")
    with pytest.raises(InvalidModelError, match=r"'m\.onnx\.data' is missing") as refused:
        inspect_model(path)
    assert "onnx.save(onnx.load('model.onnx'), 'model-single.onnx')" in str(refused.value)
    (tmp_path / "m.onnx.data").write_bytes(raw)  # the advice, followed: one file, the same weights
    single = tmp_path / "single.onnx"
    onnx.save(onnx.load(path), single)
    assert inspect_model(str(single))["num_parameters"] == inspect_model(path)["num_parameters"] > 0
