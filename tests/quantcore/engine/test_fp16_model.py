"""fp16_model: the FP16 baseline computes what the FP32 model computes, within float16 precision."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, shape_inference

from quantcore.runtime.session import open_session
from quantcore.tensorrt.fp16_model import to_float16
from samples.zoo import ZOO, build


@pytest.mark.parametrize("name", ZOO)
def test_fp16_model_matches_fp32(name: str) -> None:
    zoo = build(name)
    half = to_float16(zoo.model)
    onnx.checker.check_model(half.model, full_check=True)
    shape_inference.infer_shapes(half.model, strict_mode=True)  # every op sees consistent types
    assert half.saturated == 0 and half.converted_tensors > 0
    assert [i.type.tensor_type.elem_type for i in half.model.graph.input] == [
        i.type.tensor_type.elem_type for i in zoo.model.graph.input
    ]
    float_initializers = [t.name for t in half.model.graph.initializer if t.data_type == TensorProto.FLOAT]
    assert len(float_initializers) < len(half.model.graph.initializer)  # weights went to float16
    feeds = {k: v[:4] for k, v in zoo.inputs.items()}
    with open_session(zoo.model) as session:
        reference = session.run(None, feeds)
    # No graph optimizations: ONNX Runtime's CPU fusions would otherwise re-insert float32 casts.
    with open_session(half.model, optimization=ort.GraphOptimizationLevel.ORT_DISABLE_ALL) as session:
        candidate = session.run(None, feeds)
    for x, y in zip(reference, candidate, strict=True):
        assert y.dtype == x.dtype and y.shape == x.shape
        # float16 keeps 11 significant bits (relative step 2^-11 ≈ 5e-4 per rounding); a few layers of
        # accumulated rounding stay well inside 1% of the output's range (measured ≤ 6e-4 here).
        assert np.abs(x - y).max() <= 1e-2 * np.abs(x).max(), name
