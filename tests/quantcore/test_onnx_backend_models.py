"""Models nobody here wrote, from the onnx package's own backend test data (installed with it; nothing is
downloaded):

- ``pytorch-converted`` and ``pytorch-operator``: single modules and operators (Conv1d-3d with groups,
  dilation and padding, ConvTranspose, Linear, PReLU, pooling, padding, GLU, PixelShuffle, Embedding...)
  as an early PyTorch exporter wrote them, at opsets 6 to 9, each with the input it was exported with;
- ``light``: the Caffe2 model-zoo graphs (opset 9, IR version 3 with the initializers listed as graph
  inputs, BatchNormalization with a Caffe2 affine Mul/Add, LRN, multi-input Sum, Dropout), whose weights
  the package replaced by ConstantOfShape fills of 0.02; here they get random weights back.

Every one either quantizes with every preset or is refused with a quantcore error that says why; none
crashes. The refusals are of two kinds, both checked against their cause: ONNX Runtime has no kernel
for the model's opset (opset 6 Mul, Gemm, BatchNormalization...: the model does not run at all), or its
inputs hold no common sample axis (an operator test that broadcasts a (3,) operand against a (2, 3) one).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from quantcore import PLATFORMS, AnalysisOptions, InvalidDataError, QuantcoreError, QuantizeConfig, prepare, quantize
from quantcore.config import WEIGHT_ONLY_PLATFORM
from quantcore.errors import UnsupportedModelError
from quantcore.tensorrt.engine import check_qdq
from tests.quantcore.test_zoo import check_against_fake_quant

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
OPERATOR_CASES = sorted(
    [*(DATA / "pytorch-converted").glob("test_*"), *(DATA / "pytorch-operator").glob("test_*")],
    key=lambda p: p.name,
)
# Exact Q/DQ against FP32 on one module's output, where something was quantized: 8-bit integers give
# 38.7 dB or more on these inputs, FP8 E4M3 (3 mantissa bits) 27.3 or more (measured on every case
# and preset); the bounds leave about 8 and 5 dB for other machines' float rounding.
MIN_SQNR_DB = {"tensorrt-fp8": 22.0}
DEFAULT_MIN_SQNR_DB = 30.0

NO_WEIGHT = "no MatMul or Gemm with a constant 2-D float32 weight"  # the weight-only platform's refusal


def _case(directory: Path) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    model = onnx.load(directory / "model.onnx")
    constants = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in constants]
    arrays = [
        numpy_helper.to_array(onnx.load_tensor(str(path)))
        for path in sorted((directory / "test_data_set_0").glob("input_*.pb"))
    ]
    return model, dict(zip(names, arrays, strict=True))


def _runs_in_onnx_runtime(model: onnx.ModelProto) -> bool:
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # NOT_IMPLEMENTED: no kernel for an op at this opset
        return False
    return True


def _no_common_sample_axis(data: dict[str, np.ndarray]) -> bool:
    return len({a.shape[0] if a.ndim else None for a in data.values()}) > 1


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_early_pytorch_exports_quantize_or_are_refused_with_the_reason(platform, tmp_path) -> None:
    quantized = nothing_to_quantize = 0
    for directory in OPERATOR_CASES:
        model, data = _case(directory)
        config = QuantizeConfig(platform=platform, cpu_latency=False, analysis=AnalysisOptions(enabled=False))
        try:
            result = quantize(directory / "model.onnx", data, data, config, tmp_path / directory.name)
        except QuantcoreError as error:
            if isinstance(error, InvalidDataError):  # checked first, before the model is loaded
                assert _no_common_sample_axis(data), (directory.name, error)
            elif platform == WEIGHT_ONLY_PLATFORM and NO_WEIGHT in str(error):  # the operator cases' usual lot
                nothing_to_quantize += 1
            else:
                assert not _runs_in_onnx_runtime(model), (directory.name, error)
                assert "ONNX Runtime cannot load the model" in str(error), directory.name
            continue
        quantized += 1
        exported = onnx.load(result.model_path)
        onnx.checker.check_model(exported)
        assert [o.name for o in exported.graph.output] == [o.name for o in model.graph.output]
        quantizers = result.report["evaluation"]["model"]["quantize_linear_nodes"]
        for name, metrics in result.report["evaluation"]["qdq_exact"]["outputs"].items():
            assert metrics["nonfinite"] == 0, (directory.name, name)  # the sqrt of negatives: NaN in both
            if quantizers and metrics["sqnr_db"] is not None:
                assert metrics["sqnr_db"] >= MIN_SQNR_DB.get(platform, DEFAULT_MIN_SQNR_DB), (directory.name, name)
    # the refusals above leave exactly the cases ONNX Runtime runs whose inputs share a sample axis: 83
    # of the 117 in onnx 1.23 (the other 34 are opset 6 models ONNX Runtime has no kernels for); the weight-only
    # platform refuses, at annotate, those without a MatMul/Gemm weight among them
    assert quantized + nothing_to_quantize >= 83


# The Caffe2 graphs small enough for the suite (resnet50, inception_v2, vgg19, alexnet and zfnet512 take
# 5 to 60 s each per preset here).
CAFFE2_MODELS = ("squeezenet", "shufflenet", "inception_v1", "densenet121")
# What the graphs test is how Caffe2 wrote them (the affine Mul/Add, LRN, Sum, Dropout, initializers as
# inputs), which every integer preset meets the same way: squeezenet runs every preset, the larger graphs
# the two that quantize only MatMul/Gemm and one integer preset each (densenet121 alone took 20 to 35 s per
# integer preset).
CAFFE2_CASES = [
    *((name, platform) for name in CAFFE2_MODELS for platform in ("onnxruntime-dynamic", WEIGHT_ONLY_PLATFORM)),
    *(("squeezenet", platform) for platform in ("academic", "onnxruntime", "tensorrt", "tensorrt-fp8")),
    ("shufflenet", "onnxruntime"),
    ("inception_v1", "academic"),
    ("densenet121", "tensorrt"),
]


def caffe2_model(name: str, seed: int = 0) -> onnx.ModelProto:
    """The ``light`` graph of ``name`` with each ConstantOfShape fill replaced by a random initializer
    (listed as a graph input too, as IR version 3 wants): He-normal conv and dense weights, small biases,
    BatchNormalization scales and variances in [0.5, 1.5], means and shifts around 0. The reader decides
    the role: a Conv's or Gemm's weight, a bias, or a BatchNormalization (or affine Mul/Add) parameter."""
    model = onnx.load(DATA / "light" / f"light_{name}.onnx")
    graph = model.graph
    rng = np.random.default_rng(seed)
    shapes = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    readers: dict[str, tuple[onnx.NodeProto, int]] = {}
    for node in graph.node:
        for position, tensor in enumerate(node.input):
            readers.setdefault(tensor, (node, position))
    nodes, weights = [], []
    for node in graph.node:
        if node.op_type != "ConstantOfShape":
            nodes.append(node)
            continue
        shape = tuple(int(d) for d in shapes[node.input[0]])
        reader, position = readers[node.output[0]]
        role = reader.op_type
        if role == "Unsqueeze":  # a Caffe2 affine parameter: the Mul's scales like a BN scale, the Add's shifts
            role, position = "BatchNormalization", 1 if readers[reader.output[0]][0].op_type == "Mul" else 2
        if role in ("Conv", "Gemm", "Reshape") and position in (0, 1):  # a weight (through a Reshape: a dense one)
            value = rng.normal(0, np.sqrt(2 / max(int(np.prod(shape[1:])), 1)), shape)
        elif role == "BatchNormalization" and position in (1, 4):  # scale, variance
            value = rng.uniform(0.5, 1.5, shape)
        else:  # biases, BN means and shifts
            value = rng.normal(0, 0.1 if role == "BatchNormalization" else 0.05, shape)
        weights.append(numpy_helper.from_array(value.astype(np.float32), node.output[0]))
    used = {tensor for node in nodes for tensor in node.input}
    initializers = [t for t in graph.initializer if t.name in used] + weights
    inputs = [i for i in graph.input if i.name not in shapes or i.name in used]
    inputs += [onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in weights]
    for field, values in ((graph.node, nodes), (graph.initializer, initializers), (graph.input, inputs)):
        del field[:]
        field.extend(values)
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def caffe2(request, tmp_path_factory):
    model = caffe2_model(request.param)
    path = tmp_path_factory.mktemp(request.param) / "model.onnx"
    onnx.save(model, path)
    image = next(i for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer})
    shape = [d.dim_value for d in image.type.tensor_type.shape.dim]
    images = np.random.default_rng(1).standard_normal((6, *shape[1:])).astype(np.float32)
    return request.param, path, image.name, images


@pytest.mark.parametrize(("caffe2", "platform"), CAFFE2_CASES, indirect=["caffe2"])
def test_caffe2_model_zoo_graphs_at_opset_9_quantize(caffe2, platform, tmp_path) -> None:
    name, path, image, images = caffe2
    config = QuantizeConfig(platform=platform, cpu_latency=False, analysis=AnalysisOptions(enabled=False))
    try:
        result = quantize(path, {image: images[:4]}, {image: images[4:]}, config, tmp_path)
    except UnsupportedModelError as error:  # weight-only: CNNs whose only Gemm writes the output (kept float)
        assert platform == WEIGHT_ONLY_PLATFORM and NO_WEIGHT in str(error), error
        return
    assert "opset upgraded from 9 to 13 for per-channel Q/DQ" in result.report["warnings"]
    exported = onnx.load(result.model_path)
    onnx.checker.check_model(exported)
    assert [o.name for o in exported.graph.output] == [o.name for o in onnx.load(path).graph.output]
    evaluation = result.report["evaluation"]
    assert evaluation["qdq_deployed"]["skipped"] is None
    assert all(m["nonfinite"] == 0 for m in evaluation["qdq_exact"]["outputs"].values())
    if platform in ("onnxruntime-dynamic", WEIGHT_ONLY_PLATFORM):  # MatMul/Gemm weights only; the convs stay float
        return
    # every convolution reads a dequantized weight; every quantized tensor is within one step of the
    # torch fake-quant kernels (random weights make the outputs' SQNR meaningless, not the arithmetic)
    producers = {o: n.op_type for n in exported.graph.node for o in n.output}
    convs = [n for n in exported.graph.node if n.op_type == "Conv"]
    assert convs and all(producers.get(n.input[1]) == "DequantizeLinear" for n in convs), name
    assert check_against_fake_quant(result.model_path, prepare(path).model, {image: images[4:5]}) > 0
    if platform == "tensorrt":
        assert [f.to_dict() for f in check_qdq(exported)] == []
