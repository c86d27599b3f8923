"""The digits sample: deterministic, and exported the way quantcore's tests rely on."""

from __future__ import annotations

import numpy as np
import onnx

from samples.digits import build_digits


def test_build_is_deterministic_and_keeps_batchnorm(tmp_path) -> None:
    first = build_digits(tmp_path / "a", epochs=2, seed=7)
    second = build_digits(tmp_path / "b", epochs=2, seed=7)
    assert first[0].read_bytes() == second[0].read_bytes()  # same seed → byte-identical model
    a, b = np.load(first[1]), np.load(second[1])
    np.testing.assert_array_equal(a["input"], b["input"])
    np.testing.assert_array_equal(a["labels"], b["labels"])
    assert a["input"].shape == (1797, 1, 8, 8) and a["input"].dtype == np.float32
    assert a["labels"].dtype == np.int64 and sorted(set(a["labels"].tolist())) == list(range(10))
    assert a["input"].min() >= 0.0 and a["input"].max() <= 1.0

    model = onnx.load(str(first[0]))
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("BatchNormalization") == 4 and "Add" in ops  # unfused BN, residual join
    assert model.opset_import[0].version == 17
    assert [i.name for i in model.graph.input] == ["input"] and [o.name for o in model.graph.output] == ["logits"]
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # dynamic batch axis


def test_other_seed_shuffles_differently(tmp_path) -> None:
    _, data_a = build_digits(tmp_path / "a", epochs=1, seed=0)
    _, data_b = build_digits(tmp_path / "b", epochs=1, seed=1)
    assert not np.array_equal(np.load(data_a)["labels"], np.load(data_b)["labels"])
