"""Engine-vs-ONNX Runtime comparison and the engine's latency batches, on inputs whose samples do not
all run along axis 0. The engine is the GPU part: here ONNX Runtime's CPU EP stands in for it."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from quantcore.runtime.batching import input_specs
from quantcore.tensorrt.comparison import compare_with_references
from quantcore.tensorrt.engine import _latency_batches, _specs_at
from quantcore.tensorrt.profiles import observed_shapes, profiles_for
from samples.tiny import stateful_data, stateful_model
from tests.quantcore.models import save


def test_comparison_feeds_each_input_along_its_batch_axis(tmp_path) -> None:
    model = stateful_model(state_size=16)
    path = save(model, tmp_path / "stateful.onnx")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    fed = []

    def engine(feeds):
        fed.append(dict(feeds))
        return dict(zip(names, session.run(names, dict(feeds)), strict=True))

    data = stateful_data(20, seed=4, state_size=16)
    result = compare_with_references(engine, {"fp32": (path, False)}, data, 8, input_specs(model))
    assert result["num_samples"] == 20 and result["batch_size"] == 8
    assert [f["state"].shape for f in fed] == [(2, 8, 16), (2, 8, 16), (2, 4, 16)]
    # exact: the batches are slices of the data, no arithmetic
    np.testing.assert_array_equal(np.concatenate([f["state"] for f in fed], axis=1), data["state"])
    np.testing.assert_array_equal(np.concatenate([f["x"] for f in fed], axis=0), data["x"])
    assert all(f["sr"].shape == () for f in fed)  # the constant input, whole with every batch
    # the same model on the same feeds: equal to the bit
    assert result["vs_fp32"]["y"]["max_abs_error"] == 0.0


def test_latency_batches_and_pinned_shapes_follow_the_batch_axis() -> None:
    model = stateful_model(state_size=16)
    specs = input_specs(model)
    shapes = observed_shapes(stateful_data(40, seed=0, state_size=16), 16, specs)
    profiles = profiles_for(model, calibration_shapes=shapes, batch_sizes=(1, 32))
    assert _latency_batches(specs, profiles, (1, 32, 64)) == [1, 32]  # 64 is outside the profile's 1..32
    pinned = {spec.name: spec for spec in _specs_at(specs, profiles)}
    assert pinned["state"].shape == (2, "batch", 16) and pinned["state"].batch_axis == 1
    assert pinned["sr"].batch_axis is None
