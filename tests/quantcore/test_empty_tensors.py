"""Tensors with no element (a padding of length 0, as BrainMaze's EEG spindle detector builds one): prepare
lists them, no platform quantizes them, and the model runs on ONNX Runtime's integer kernels."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantcore import PLATFORMS, QuantizeConfig, annotate, prepare
from quantcore.config import default_precision
from tests.quantcore.test_robustness import _model


def _empty_padding_model() -> onnx.ModelProto:
    """x (N, 2, 16) → Conv → Relu → Transpose = t (N, 16, 1), concatenated on axis 1 with a padding of
    length 0: ConstantOfShape([N, 0, 1], 1.0) · -1e9, an empty (N, 0, 1) tensor. BrainMaze's EEG spindle
    detector (brainmaze-eeg-models 0.1.0) ends with this idiom."""

    def const(name: str, value) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(value), name)

    weights = np.random.default_rng(7).normal(0, 0.3, (1, 2, 3)).astype(np.float32)  # not the module's RNG:
    # the numbers below must not depend on which tests ran before

    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", kernel_shape=[3], pads=[1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Transpose", ["r"], ["t"], name="transpose", perm=[0, 2, 1]),
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "zero"], ["n"], name="gather", axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"], name="unsqueeze"),
        helper.make_node("Concat", ["n1", "length", "one"], ["pad_shape"], name="pad_shape", axis=0),
        helper.make_node(
            "ConstantOfShape", ["pad_shape"], ["ones"], name="ones", value=const("v", np.array([1.0], np.float32))
        ),
        helper.make_node("Mul", ["ones", "minus"], ["pad"], name="pad"),
        helper.make_node("Concat", ["t", "pad"], ["y"], name="padded", axis=1),
    ]
    initializers = [
        const("w", weights),
        const("b", np.zeros(1, np.float32)),
        const("zero", np.array(0, np.int64)),
        const("axes", np.array([0], np.int64)),
        const("length", np.array([0], np.int64)),
        const("one", np.array([1], np.int64)),
        const("minus", np.array(-1e9, np.float32)),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16, 1])],
        initializers,
    )


def test_tensors_with_no_element_are_never_quantized() -> None:
    prepared = prepare(_empty_padding_model())
    assert prepared.empty_tensors == {"ones", "pad"}  # shape inference propagates the 0 into ['N', 0, 1]
    for node in ("ones", "pad"):
        assert prepared.float_nodes[node] == f"output with no element ({node} ['N', 0, 1]): nothing to quantize"
    for platform in PLATFORMS:
        annotation = annotate(prepared, QuantizeConfig(platform=platform, precision=default_precision(platform)))
        assert not {"ones", "pad", "minus"} & set(annotation.configs), platform
        assert annotation.decisions["ones"] == annotation.decisions["pad"] == "float"


def test_a_model_with_an_empty_padding_quantizes_and_runs_on_the_integer_kernels(tmp_path) -> None:
    """The onnxruntime preset used to put QuantizeLinear on the empty padding, and ONNX Runtime 1.32 fused
    it into a QLinearMul that crashed the process (SIGSEGV) on two intra-op threads: the job's worker
    died in evaluate, every attempt. The quantization runs in a child process so that a regression
    fails this test instead of killing the test run."""
    path = tmp_path / "model.onnx"
    onnx.save(_empty_padding_model(), str(path))
    x = np.random.default_rng(8).normal(size=(64, 2, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    script = (
        "import numpy as np, sys, json\n"
        "from quantcore import QuantizeConfig, quantize\n"
        f"x = np.load({str(tmp_path / 'x.npy')!r})\n"
        f"result = quantize({str(path)!r}, {{'x': x[:48]}}, {{'x': x[48:]}},\n"
        "    QuantizeConfig(platform='onnxruntime', batch_size=8, cpu_latency=False), sys.argv[1])\n"
        "evaluation = result.report['evaluation']\n"
        "print(json.dumps([evaluation[k]['outputs']['y']['sqnr_db'] for k in ('qdq_exact', 'qdq_deployed')]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "out")], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]  # -11: the process died of SIGSEGV
    exact, deployed = json.loads(done.stdout.strip().splitlines()[-1])
    # the padding is empty, so y is t, an 8-bit conv output: measured 42.1 dB both ways; the integer kernels
    # reproduce exact Q/DQ within the parity check's 0.5 dB
    assert exact > 30
    assert abs(deployed - exact) <= 0.5
