"""Every zoo model (samples/zoo.py, plus the trained digits CNN; those exported from torch also as
its default dynamo exporter writes them, ``resnet:dynamo``...) times every platform in
``quantcore.annotate.platforms.PLATFORMS`` (iterated, so new platforms are covered as they land) quantizes
with ``quantcore.quantize``, and the result

- passes ``onnx.checker`` (full check) and loads and runs in ONNX Runtime, with integer kernels and
  as exact Q/DQ arithmetic;
- keeps the graph input/output names, ranks, fixed sizes and symbolic (dynamic) dimensions, and runs
  on a batch with other sizes on those dimensions;
- on ``onnxruntime-weight-only`` (MatMulNBits by default, no Q/DQ pairs): quantizes the MatMul/Gemm weights
  when the model has one that is not its LM head, else fails at once saying it found none; its blockwise
  numerics are tested against a numpy reference in test_weight_only.py, not here;
- agrees with the torch fake-quant kernels (``quantcore.numerics.fake_quant``) tensor by tensor: for every
  DequantizeLinear of the exported model, ONNX Runtime's exact-QDQ output equals fake-quantizing
  the float tensor the QuantizeLinear read in that same run (for a weight: the prepared FP32
  initializer) with the scale and zero point the model stores, within one quantization step; after a
  DynamicQuantizeLinear, the same with the torch kernels' DYNAMIC policy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, numpy_helper

from quantcore import QuantizeConfig, prepare, quantize
from quantcore.annotate.platforms import PLATFORMS
from quantcore.config import WEIGHT_ONLY_PLATFORM, default_precision
from quantcore.errors import UnsupportedModelError
from quantcore.runtime.session import open_session
from samples.zoo import EXPORTED, ZOO, ZooModel, build

INTEGER_RANGES = {
    TensorProto.INT8: (-128, 127),
    TensorProto.UINT8: (0, 255),
    TensorProto.INT16: (-(2**15), 2**15 - 1),
    TensorProto.UINT16: (0, 2**16 - 1),
    TensorProto.INT32: (-(2**31), 2**31 - 1),
    TensorProto.INT4: (-8, 7),
    TensorProto.UINT4: (0, 15),
}
FLOAT8_FORMATS = {TensorProto.FLOAT8E4M3FN: (4, 3), TensorProto.FLOAT8E5M2: (5, 2)}


@pytest.fixture
def zoo_model(request, digits_sample) -> ZooModel:
    if request.param == "digits":
        images = digits_sample.images
        return ZooModel("digits", onnx.load(str(digits_sample.model_path)), {"input": images[:24]})
    name, _, exporter = request.param.partition(":")
    return build(name, exporter or "torchscript")


def _dims(value_info: onnx.ValueInfoProto) -> list[int | str | None]:
    return [
        int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or None)
        for d in value_info.type.tensor_type.shape.dim
    ]


def _run(model: onnx.ModelProto | str, feeds: dict[str, np.ndarray], names: list[str] | None = None, **options):
    if names is not None:
        copy = onnx.load(model) if isinstance(model, str) else model
        existing = {o.name for o in copy.graph.output}
        copy.graph.output.extend(onnx.ValueInfoProto(name=n) for n in dict.fromkeys(names) if n not in existing)
        model = copy
    with open_session(model, **options) as session:
        wanted = names or [o.name for o in session.get_outputs()]
        return dict(zip(wanted, session.run(wanted, feeds), strict=True))


def _weighted_matmuls(model: onnx.ModelProto) -> int:
    initializers = {t.name for t in model.graph.initializer}
    return sum(n.op_type == "MatMul" and n.input[1] in initializers for n in model.graph.node)


def _weight_only_layers(model: onnx.ModelProto) -> int:
    """MatMul/Gemm nodes with a 2-D initializer weight that do not write a graph output (an LM head)."""
    initializers = {t.name: t for t in model.graph.initializer}
    outputs = {o.name for o in model.graph.output}
    return sum(
        n.op_type in ("MatMul", "Gemm")
        and n.input[1] in initializers
        and len(initializers[n.input[1]].dims) == 2
        and n.output[0] not in outputs
        for n in model.graph.node
    )


def _simulate_dynamic(x: np.ndarray) -> tuple:
    """(fake-quantized x, tolerance): the torch kernels' DYNAMIC policy, which must reproduce ONNX's
    DynamicQuantizeLinear (uint8, the range of x widened to 0)."""
    from quantcore.numerics.fake_quant import fake_quantize_numpy
    from quantcore.numerics.policy import make_policy
    from quantcore.numerics.tqc import QuantState, TensorQuantConfig

    tqc = TensorQuantConfig(policy=make_policy(symmetric=False, dynamic=True), state=QuantState.ACTIVATED)
    step = (max(float(x.max()), 0.0) - min(float(x.min()), 0.0)) / 255
    return fake_quantize_numpy(x, tqc), step * (1 + 1e-4)


def _simulate(x: np.ndarray, scale: np.ndarray, zero: onnx.TensorProto | None, axis: int | None) -> tuple:
    """(fake-quantized x, tolerance array): the torch kernels with the model's own scale/zero point."""
    elem_type = zero.data_type if zero is not None else TensorProto.UINT8
    offset = numpy_helper.to_array(zero).astype(np.float32) if zero is not None else np.zeros_like(scale)
    axis = None if scale.ndim == 0 else axis
    x_t = torch.from_numpy(np.array(x, dtype=np.float32))  # a writable copy
    if axis is not None:
        axis = axis % x.ndim
    shape = [1] * x.ndim
    if axis is not None:
        shape[axis] = -1
    step = np.abs(scale).reshape(shape) if axis is not None else np.abs(scale)
    if elem_type in FLOAT8_FORMATS:
        floating = pytest.importorskip("quantcore.numerics.floating")
        fmt = floating.float_format(*FLOAT8_FORMATS[elem_type])
        y = floating.fake_quantize_float(x_t, torch.from_numpy(scale), fmt, axis).numpy()
        # one FP8 step at y's magnitude: 2^-M relative, the subnormal step 2^(1-B-M) absolute
        exponent, mantissa = FLOAT8_FORMATS[elem_type]
        bias = 2 ** (exponent - 1) - 1
        return y, np.abs(y) * 2.0**-mantissa + step * 2.0 ** (1 - bias - mantissa)
    from quantcore.numerics.fake_quant import fake_quantize

    quant_min, quant_max = INTEGER_RANGES[elem_type]
    y = fake_quantize(x_t, torch.from_numpy(scale), torch.from_numpy(offset), quant_min, quant_max, axis).numpy()
    # one step: a value on a rounding tie may round either way when x/s is computed as x·(1/s) (or, for an
    # int32 bias with codes near 2^16, in float32 at all: its ulp there is 1/256 of a step), plus the
    # float32 rounding of the dequantized value itself (one ulp of it)
    return y, step * (1 + 1e-4) + np.spacing(np.abs(y))


def check_against_fake_quant(qdq_path: Path, prepared: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> int:
    """The per-tensor comparison of the module docstring; returns the number of tensors compared."""
    model = onnx.load(str(qdq_path))
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    prepared_nodes = {n.name: n for n in prepared.graph.node}
    prepared_weights = {t.name: numpy_helper.to_array(t) for t in prepared.graph.initializer}
    cases = []  # (dq output, float source tensor or None, float weight value or None, scale, zero, axis)
    for node in graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        source = producers.get(node.input[0])
        if source is not None and source.op_type == "DynamicQuantizeLinear":
            cases.append((node.output[0], source.input[0], None, None, None, None))
            continue
        if node.input[1] not in initializers:
            continue
        scale = numpy_helper.to_array(initializers[node.input[1]]).astype(np.float32)
        zero = initializers.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        if source is not None and source.op_type == "QuantizeLinear":
            cases.append((node.output[0], source.input[0], None, scale, zero, axis))
        elif node.input[0] in initializers:  # a weight stored quantized: find the float original
            weight = None
            for reader in graph.node:
                for i, name in enumerate(reader.input):
                    original = prepared_nodes.get(reader.name)
                    if name == node.output[0] and original is not None and i < len(original.input):
                        weight = prepared_weights.get(original.input[i])
            if weight is not None:
                cases.append((node.output[0], None, weight, scale, zero, axis))
    names = [c[0] for c in cases] + [c[1] for c in cases if c[1] is not None]
    values = _run(model, feeds, names, exact_qdq=True)
    for output, source, weight, scale, zero, axis in cases:
        x = values[source] if source is not None else weight
        expected, tolerance = _simulate_dynamic(x) if scale is None else _simulate(x, scale, zero, axis)
        error = np.abs(values[output].astype(np.float32) - expected)
        worst = np.unravel_index(np.argmax(error - tolerance), error.shape) if error.size else ()
        allowed = np.broadcast_to(tolerance, error.shape)
        assert np.all(error <= allowed), (
            f"{output}: ORT exact QDQ and torch fake-quant differ by {error[worst]} > {allowed[worst]} at {worst}"
        )
    return len(cases)


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
@pytest.mark.parametrize("zoo_model", [*ZOO, "digits", *(f"{name}:dynamo" for name in EXPORTED)], indirect=True)
def test_zoo_model_quantizes(zoo_model: ZooModel, platform: str, tmp_path: Path) -> None:
    source = tmp_path / "model.onnx"
    onnx.save(zoo_model.model, str(source))
    config = QuantizeConfig(platform=platform, precision=default_precision(platform), batch_size=8)
    if platform == WEIGHT_ONLY_PLATFORM and not _weight_only_layers(prepare(source).model):
        with pytest.raises(UnsupportedModelError, match="no MatMul or Gemm with a constant 2-D float32 weight"):
            quantize(source, zoo_model.calibration, zoo_model.evaluation, config, tmp_path / "out")
        return
    result = quantize(source, zoo_model.calibration, zoo_model.evaluation, config, tmp_path / "out")

    # structure: checker, names, ranks, fixed and symbolic dimensions
    onnx.checker.check_model(str(result.model_path), full_check=True)
    exported = onnx.load(str(result.model_path))
    original = zoo_model.model.graph
    real_inputs = [i for i in original.input if i.name not in {t.name for t in original.initializer}]
    assert [i.name for i in exported.graph.input] == [i.name for i in real_inputs]
    assert [o.name for o in exported.graph.output] == [o.name for o in original.output]
    pairs = [
        *zip(real_inputs, exported.graph.input, strict=True),
        *zip(original.output, exported.graph.output, strict=True),
    ]
    for before, after in pairs:
        assert _dims(after) == _dims(before), f"{before.name}: dimensions changed"
    dequantize_op = "MatMulNBits" if platform == WEIGHT_ONLY_PLATFORM else "DequantizeLinear"
    dequantized = sum(n.op_type == dequantize_op for n in exported.graph.node)
    prepared = prepare(source)
    if platform == "onnxruntime-dynamic" and not _weighted_matmuls(prepared.model):  # its only quantized op
        assert dequantized == 0 and any("found nothing to quantize" in w for w in result.report["warnings"])
        return
    assert dequantized > 0

    # runs, with integer kernels and as exact QDQ, and on other sizes of the dynamic axes
    feeds = {k: v[:4] for k, v in zoo_model.evaluation.items()}
    reference = _run(zoo_model.model, feeds)
    # As the evaluate stage deploys it: full optimization, or basic where ONNX Runtime cannot build the
    # full graph (FP8 on the CPU EP: ORT 1.31 fuses float8 Q/DQ into QLinearConv and then rejects it).
    fallback = result.report["evaluation"]["qdq_deployed"].get("fallback")
    deployment = {"optimization": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC} if fallback else {}
    deployed = _run(str(result.model_path), feeds, **deployment)
    for name, value in reference.items():
        assert deployed[name].shape == value.shape and np.all(np.isfinite(deployed[name]))
    if zoo_model.resized:
        expected_shapes = {k: v.shape for k, v in _run(zoo_model.model, zoo_model.resized).items()}
        resized = _run(str(result.model_path), zoo_model.resized, **deployment)
        assert {k: v.shape for k, v in resized.items()} == expected_shapes

    if platform == WEIGHT_ONLY_PLATFORM:
        return  # no Q/DQ pair to compare; blockwise numerics: test_weight_only.py
    # numerics: every quantized tensor within one step of the torch fake-quant simulation
    assert check_against_fake_quant(result.model_path, prepared.model, feeds) > 0
