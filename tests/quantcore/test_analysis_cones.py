"""The layer-wise runs on cones (``quantcore.analysis.cones``): every layer's outputs as the whole gated
model gives them, on graphs with residual Adds, skip Concats, several outputs and dynamic axes; smaller
runs than the whole model's; and no cones where the model is too big for them."""

from __future__ import annotations

import numpy as np
import pytest

from quantcore import QuantizeConfig, annotate, calibrate, prepare
from quantcore.analysis import cones as cones_module
from quantcore.analysis.cones import layer_runs
from quantcore.analysis.switch import MASK_INPUT, gated_model
from quantcore.runtime.session import open_session
from samples import zoo
from tests.quantcore.models import save, two_heads


def _gated(name: str, tmp_path):
    model = zoo.build(name)
    config = QuantizeConfig(platform="tensorrt", cpu_latency=False, batch_size=4)
    prepared = prepare(save(model.model, tmp_path / f"{name}.onnx"))
    calibrated = calibrate(prepared, annotate(prepared, config), model.calibration, config)
    batch = {key: value[:4] for key, value in model.evaluation.items()}
    return gated_model(prepared, calibrated), batch


@pytest.mark.parametrize("name", ["resnet", "unet", "detector", "transformer", "branchy"])
def test_every_layer_on_its_cone_gives_the_whole_models_outputs(name: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(cones_module, "groups_for", lambda layers: 3)  # the zoo's 6 to 12 layers alone get 1 or 2
    gated, batch = _gated(name, tmp_path)
    layers = list(range(len(gated.layers)))
    first = {key: value[:1] for key, value in batch.items()}
    outputs = list(gated.outputs)
    changed = 0
    with layer_runs(gated, layers, first, device="cpu") as runs, open_session(gated.model, exact_qdq=True) as whole:
        plan = runs.plan(layers)
        # every layer in exactly one group, the groups in graph order, the last cone smaller than the model
        assert len(plan) == 3 and [k for _, group in plan for k in group] == layers
        assert len(plan[-1][0].nodes) < len(gated.model.graph.node)
        # every layer's run is priced on its cone, unless the caller has no budget to price
        assert len(runs.price(first).cone_seconds) == len(layers)
        assert runs.price(first, cones=False).cone_seconds == {}
        want_reference = whole.run(outputs, {**batch, MASK_INPUT: np.zeros(len(layers), bool)})
        for cone, group_layers in plan:
            with runs.group(cone) as group:
                reference = group.reference(batch)
                for output, value in zip(outputs, want_reference, strict=True):
                    np.testing.assert_array_equal(reference[output], value)
                for k in group_layers:
                    mask = np.zeros(len(layers), bool)
                    mask[k] = True
                    want = whole.run(outputs, {**batch, MASK_INPUT: mask})
                    got = group.quantized(k, batch, reference)
                    for a, b, r in zip(got, want, want_reference, strict=True):
                        # The same kernels on the same values: measured identical on two PaddleOCR models.
                        # A cut can still change which float kernels ONNX Runtime fuses across it, so allow
                        # float32 rounding of the largest output (1e-5); one layer's quantization moves the
                        # outputs by 2e-3 to 2e-2 of the largest (test_analysis), 200 times that.
                        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * max(1.0, float(np.abs(b).max())))
                        changed += not np.array_equal(b, r)
    assert changed, "no layer changed any output: the comparison proves nothing"


def test_groups_grow_as_the_square_root_of_the_layers_up_to_a_cap() -> None:
    # G reference runs and L cone runs cost about G + L(G + 1)/2G whole runs: least at G = sqrt(L/2)
    assert [cones_module.groups_for(n) for n in (1, 7, 8, 32, 72, 128, 256)] == [1, 1, 2, 4, 6, 8, 8]


def test_an_output_a_layer_does_not_reach_is_the_references(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(cones_module, "groups_for", lambda layers: layers)  # one layer a group
    config = QuantizeConfig(platform="tensorrt", cpu_latency=False, batch_size=4)
    prepared = prepare(save(two_heads(), tmp_path / "two_heads.onnx"))
    data = np.random.default_rng(1).normal(size=(8, 3, 8, 8)).astype(np.float32)
    calibrated = calibrate(prepared, annotate(prepared, config), {"input": data}, config)
    gated = gated_model(prepared, calibrated)
    assert [layer.node for layer in gated.layers] == ["stem", "head_a", "head_b"]
    with layer_runs(gated, [0, 1, 2], {"input": data[:1]}, device="cpu") as runs:
        stem, head_a, head_b = runs.cones
        # each head's cone is that head alone, reading the shared features (a model output itself)
        assert stem.outputs == ("out_a", "out_b", "features")
        assert head_a.outputs == ("out_a",) and head_b.outputs == ("out_b",)
        assert head_a.cut == ("features",) and len(head_a.nodes) == 2  # its flag's Gather, its If
        batch = {"input": data[4:]}
        with runs.group(head_a) as group:
            reference = group.reference(batch)
            out_a, out_b, features = group.quantized(1, batch, reference)
        assert out_b is reference["out_b"] and features is reference["features"]
        assert not np.array_equal(out_a, reference["out_a"])


def test_a_model_too_big_for_cones_runs_whole(tmp_path, monkeypatch) -> None:
    gated, batch = _gated("resnet", tmp_path)
    monkeypatch.setattr(cones_module, "CONE_MODEL_BYTES", gated.model.ByteSize() - 1)
    layers = list(range(len(gated.layers)))
    first = {key: value[:1] for key, value in batch.items()}
    with layer_runs(gated, layers, first, device="cpu") as runs:
        assert runs.cones == [] and runs.plan(layers) == [(None, layers)]
        price = runs.price(first)
        assert price.reference_seconds > 0 and price.cone_seconds == {} and price.of_layer(0) == price.reference_seconds
        assert price.fetched_bytes == sum(4 * int(np.prod(o.shape)) for o in runs_outputs(gated, first))
        with runs.group(None) as group:
            reference = group.reference(batch)
            mask = np.zeros(len(layers), bool)
            mask[0] = True
            with open_session(gated.model, exact_qdq=True) as whole:
                want = whole.run(list(gated.outputs), {**batch, MASK_INPUT: mask})
            for a, b in zip(group.quantized(0, batch, reference), want, strict=True):
                np.testing.assert_array_equal(a, b)


def runs_outputs(gated, sample):
    with open_session(gated.model, exact_qdq=True) as session:
        return session.run(list(gated.outputs), {**sample, MASK_INPUT: np.zeros(len(gated.layers), bool)})
