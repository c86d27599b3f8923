"""The torch converters of shape, index, type, normalization, Resize, Pad and LSTM nodes
(``quantcore.reconstruction``: ``shape_ops``, ``normalization_ops``, ``resize_ops``, ``recurrent_ops``
and the reductions of ``torch_ops``), each checked against ONNX Runtime on a one-node graph built here,
over the attribute variants it handles; and the per-node support check, which names the op and the
attribute of a variant it does not handle, and which the block partition reads."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from quantcore.reconstruction.blocks import whole_graph
from quantcore.reconstruction.torch_ops import OPS, unsupported
from quantcore.runtime.session import open_session

RNG = np.random.default_rng(0)
EXACT = {"rtol": 0, "atol": 0}  # index and integer ops move values without arithmetic: bit-identical
# float32 arithmetic in another order than ONNX Runtime's (a mean, an interpolation weight computed in
# float64 then rounded, a matmul's sums): a few units in the last place of values of order 1
FLOAT = {"rtol": 1e-5, "atol": 1e-5}


def run_both(op_type: str, inputs: dict, attrs: dict, *, opset: int = 17, outputs: int = 1, constant=()):
    """(ONNX Runtime's outputs, the converter's) for one ``op_type`` node. ``inputs``: name → array, or
    None for an omitted optional input; names in ``constant`` are initializers, the rest graph inputs."""
    names = [n if v is not None else "" for n, v in inputs.items()]
    node = helper.make_node(op_type, names, [f"y{i}" for i in range(outputs)], **attrs)
    feeds = {n: v for n, v in inputs.items() if v is not None and n not in constant}
    graph = helper.make_graph(
        [node],
        op_type,
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for n, v in feeds.items()],
        [helper.make_empty_tensor_value_info(f"y{i}") for i in range(outputs)],
        [numpy_helper.from_array(np.asarray(inputs[n]), n) for n in constant],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    with open_session(model) as session:
        expected = session.run(None, feeds)
    assert unsupported(node) is None, unsupported(node)
    args = [None if v is None else torch.from_numpy(np.asarray(v)) for v in inputs.values()]
    values = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    values = {k: v.decode() if isinstance(v, bytes) else v for k, v in values.items()}
    actual = OPS[op_type](args, values)
    return expected, [t.detach().numpy() for t in actual[:outputs]]


def check(op_type: str, inputs: dict, attrs: dict, tolerance: dict, **options) -> None:
    expected, actual = run_both(op_type, inputs, attrs, **options)
    for e, a in zip(expected, actual, strict=True):
        assert a.shape == e.shape and a.dtype == e.dtype
        np.testing.assert_allclose(a, e, **tolerance)


def image(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def ints(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def floats(*values: float) -> np.ndarray:
    return np.array(values, np.float32)


def resize_attrs(mode: str, transform: str | None = None, nearest: str | None = None) -> dict:
    attrs = {"mode": mode}
    if transform:
        attrs["coordinate_transformation_mode"] = transform
    if nearest:
        attrs["nearest_mode"] = nearest
    return attrs


RESIZE_CASES = {  # attributes, scales, sizes
    # ocr-det's: an integer upscale, asymmetric coordinates, floor
    "nearest asymmetric floor x2": (resize_attrs("nearest", "asymmetric", "floor"), floats(1, 1, 2, 2), None),
    "nearest half_pixel round_prefer_floor x1.7": (resize_attrs("nearest"), floats(1, 1, 1.7, 1.7), None),
    "nearest round_prefer_ceil x0.5": (
        resize_attrs("nearest", None, "round_prefer_ceil"),
        floats(1, 1, 0.5, 0.5),
        None,
    ),
    "nearest align_corners ceil, sizes": (resize_attrs("nearest", "align_corners", "ceil"), None, ints(2, 3, 9, 4)),
    "nearest pytorch_half_pixel x3": (resize_attrs("nearest", "pytorch_half_pixel"), floats(1, 1, 3, 3), None),
    "linear half_pixel x2": (resize_attrs("linear"), floats(1, 1, 2, 2), None),
    "linear half_pixel x0.6": (resize_attrs("linear"), floats(1, 1, 0.6, 0.6), None),
    "linear align_corners, sizes": (resize_attrs("linear", "align_corners"), None, ints(2, 3, 11, 7)),
    "linear asymmetric x2.5": (resize_attrs("linear", "asymmetric"), floats(1, 1, 2.5, 2.5), None),
    "linear pytorch_half_pixel, sizes 1": (resize_attrs("linear", "pytorch_half_pixel"), None, ints(2, 3, 1, 8)),
    "linear half_pixel_symmetric x1.3": (resize_attrs("linear", "half_pixel_symmetric"), floats(1, 1, 1.3, 1.3), None),
}


@pytest.mark.parametrize("case", RESIZE_CASES.values(), ids=RESIZE_CASES.keys())
def test_resize_matches_onnx_runtime(case) -> None:
    attrs, scales, sizes = case
    inputs = {"x": image(2, 3, 5, 6), "roi": None, "scales": scales, "sizes": sizes}
    if sizes is None:
        del inputs["sizes"]
    constant = [n for n in ("scales", "sizes") if inputs.get(n) is not None]
    # nearest only copies elements: exact; linear computes its weights in float64 and rounds them once
    check("Resize", inputs, attrs, EXACT if attrs["mode"] == "nearest" else FLOAT, opset=19, constant=constant)


@pytest.mark.parametrize(
    ("attrs", "reason"),
    [
        ({"mode": "cubic"}, "Resize mode 'cubic'"),
        ({"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize"}, "tf_crop_and_resize"),
        ({"mode": "linear", "antialias": 1}, "Resize antialias 1"),
        ({"keep_aspect_ratio_policy": "not_larger"}, "keep_aspect_ratio_policy 'not_larger'"),
    ],
)
def test_resize_variants_not_converted_say_which_attribute(attrs, reason) -> None:
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], **attrs)
    assert reason in unsupported(node)


def test_batch_normalization_matches_onnx_runtime() -> None:
    var = RNG.uniform(0.1, 2, 4).astype(np.float32)
    inputs = {"x": image(2, 4, 3, 5), "s": image(4), "b": image(4), "m": image(4), "v": var}
    check("BatchNormalization", inputs, {"epsilon": 1e-3}, FLOAT, constant=["s", "b", "m", "v"])
    training = helper.make_node("BatchNormalization", list(inputs), ["y"], training_mode=1)
    assert "training_mode 1" in unsupported(training)


@pytest.mark.parametrize("axis", [-1, 1])
def test_layer_normalization_matches_onnx_runtime_with_its_statistics(axis) -> None:
    # axis 1 of (2, 3, 8): normalized over (3, 8), Scale and B of that shape; outputs Y, Mean, InvStdDev
    shape = (8,) if axis == -1 else (3, 8)
    inputs = {"x": image(2, 3, 8) * 3 + 1, "scale": image(*shape), "bias": image(*shape)}
    check("LayerNormalization", inputs, {"axis": axis, "epsilon": 1e-3}, FLOAT, outputs=3, constant=["scale", "bias"])
    check("LayerNormalization", {"x": inputs["x"], "scale": inputs["scale"]}, {"axis": axis}, FLOAT, constant=["scale"])


def test_cast_truncates_toward_zero_and_maps_types() -> None:
    x = floats(-2.7, -0.5, 0.0, 0.5, 2.7, 3.0)
    check("Cast", {"x": x}, {"to": TensorProto.INT32}, EXACT)
    check("Cast", {"x": x}, {"to": TensorProto.BOOL}, EXACT)
    check("Cast", {"x": ints(-3, 0, 5)}, {"to": TensorProto.FLOAT}, EXACT)
    assert "Cast to STRING" in unsupported(helper.make_node("Cast", ["x"], ["y"], to=TensorProto.STRING))


def test_pow_keeps_the_base_type() -> None:
    check("Pow", {"x": np.abs(image(3, 4)) + 0.1, "p": floats(0.5)}, {}, FLOAT, constant=["p"])
    check("Pow", {"x": image(3, 4), "p": ints(2)}, {}, FLOAT, constant=["p"])


def test_integer_division_truncates() -> None:
    check("Div", {"a": ints(-7, 7, -8, 9), "b": ints(2, -2, 3, 4)}, {}, EXACT)


@pytest.mark.parametrize("attrs", [{}, {"start": 1}, {"start": -3, "end": -1}, {"end": 10}])
def test_shape_with_start_and_end(attrs) -> None:
    check("Shape", {"x": image(2, 3, 4, 5)}, attrs, EXACT, opset=15)


@pytest.mark.parametrize(
    ("axis", "indices"), [(0, ints(2, -1, 0)), (1, np.array([[0, -3], [2, 1]], np.int64)), (-1, np.array(-2, np.int64))]
)
def test_gather_with_negative_indices(axis, indices) -> None:
    check("Gather", {"x": image(4, 3, 5), "i": indices}, {"axis": axis}, EXACT, constant=["i"])


SLICE_CASES = {
    "positive steps": (ints(1, 0), ints(3, 5), ints(0, 2), ints(1, 2)),
    "negative step, from the end": (ints(-1), ints(-6), ints(1), ints(-1)),
    "negative step 2, clamped ends": (ints(10), ints(-100), ints(2), ints(-2)),
    "negative axes, INT64 max end": (ints(1), ints(np.iinfo(np.int64).max), ints(-1), ints(1)),
    "empty": (ints(3), ints(1), ints(0), ints(1)),
}


@pytest.mark.parametrize("case", SLICE_CASES.values(), ids=SLICE_CASES.keys())
def test_slice_matches_onnx_runtime(case) -> None:
    starts, ends, axes, steps = case
    inputs = {"x": image(4, 5, 6), "starts": starts, "ends": ends, "axes": axes, "steps": steps}
    check("Slice", inputs, {}, EXACT, constant=["starts", "ends", "axes", "steps"])
    without_axes = {"x": inputs["x"], "starts": ints(1, -2), "ends": ints(3, 0), "axes": None, "steps": ints(1, -1)}
    check("Slice", without_axes, {}, EXACT, constant=["starts", "ends", "steps"])


def test_expand_broadcasts_both_ways() -> None:
    check("Expand", {"x": image(3, 1), "shape": ints(2, 1, 4)}, {}, EXACT, constant=["shape"])


def test_range_and_constant_of_shape() -> None:
    start, limit, delta = np.array(2, np.int64), np.array(-7, np.int64), np.array(-3, np.int64)
    check("Range", {"a": start, "b": limit, "c": delta}, {}, EXACT, constant=["a", "b", "c"])
    check(
        "Range",
        {"a": np.array(0.5, np.float32), "b": np.array(3.0, np.float32), "c": np.array(0.75, np.float32)},
        {},
        EXACT,
    )
    value = numpy_helper.from_array(np.array([7], np.int64))
    check("ConstantOfShape", {"s": ints(2, 3)}, {"value": value}, EXACT, constant=["s"])
    check("ConstantOfShape", {"s": ints(4)}, {}, EXACT, constant=["s"])


PAD_CASES = {
    "constant value, all axes": ("constant", ints(0, 1, 2, 0, 2, 1), floats(1.5), None),
    "negative pads crop": ("constant", ints(0, -1, 1, 0, 2, -2), None, None),
    "reflect on axes -1, 1": ("reflect", ints(3, 2, 2, 1), None, ints(-1, 1)),
    "edge": ("edge", ints(0, 2, 1, 0, 1, 3), None, None),
    "wrap": ("wrap", ints(0, 2, 4, 0, 1, 3), None, None),
}


@pytest.mark.parametrize("case", PAD_CASES.values(), ids=PAD_CASES.keys())
def test_pad_matches_onnx_runtime(case) -> None:
    mode, pads, value, axes = case
    inputs = {"x": image(2, 4, 5), "pads": pads, "value": value, "axes": axes}
    if axes is None:
        del inputs["axes"]
    constant = [n for n in ("pads", "value", "axes") if inputs.get(n) is not None]
    check("Pad", inputs, {"mode": mode}, EXACT, opset=19, constant=constant)


@pytest.mark.parametrize(
    ("op_type", "axes", "attrs"),
    [
        ("ReduceSum", ints(1), {"keepdims": 0}),
        ("ReduceSum", ints(-1, 0), {}),
        ("ReduceSum", None, {"noop_with_empty_axes": 1}),
        ("ReduceL2", ints(-1), {"keepdims": 1}),
        ("ReduceL2", None, {"keepdims": 0}),
    ],
)
def test_reductions_match_onnx_runtime(op_type, axes, attrs) -> None:
    inputs = {"x": image(3, 4, 5)} if axes is None else {"x": image(3, 4, 5), "axes": axes}
    check(op_type, inputs, attrs, FLOAT, opset=18, constant=["axes"] if axes is not None else [])


LSTM_CASES = {
    "forward, zero states, no bias": ("forward", False),
    "reverse, states and bias": ("reverse", True),
    "bidirectional, states and bias": ("bidirectional", True),
}


def lstm_inputs(direction: str, full: bool) -> dict:
    d, t, b, i, h = (2 if direction == "bidirectional" else 1), 5, 3, 4, 6
    inputs = {"x": image(t, b, i), "w": image(d, 4 * h, i) * 0.5, "r": image(d, 4 * h, h) * 0.5}
    if full:
        inputs |= {"b": image(d, 8 * h), "lens": None, "h0": image(d, b, h), "c0": image(d, b, h)}
    return inputs


@pytest.mark.parametrize("case", LSTM_CASES.values(), ids=LSTM_CASES.keys())
def test_lstm_matches_onnx_runtime(case) -> None:
    direction, full = case
    inputs = lstm_inputs(direction, full)
    constant = [n for n in ("w", "r", "b") if n in inputs]
    # Y, Y_h, Y_c after 5 steps of float32 matmuls and saturating gates: within 1e-5 of ONNX Runtime's
    check("LSTM", inputs, {"direction": direction, "hidden_size": 6}, FLOAT, outputs=3, constant=constant)


def test_lstm_layout_1_is_layout_0_transposed() -> None:
    # ONNX Runtime's CPU LSTM refuses layout 1 (batch first), so it is checked against the converter's
    # own layout 0, which the test above checks against ONNX Runtime: the same arithmetic, transposed
    inputs = lstm_inputs("bidirectional", True)
    args = [None if v is None else torch.from_numpy(v) for v in inputs.values()]
    y, y_h, y_c = OPS["LSTM"](args, {"direction": "bidirectional", "hidden_size": 6})
    batch_first = list(args)
    batch_first[0] = args[0].transpose(0, 1)  # X (B, T, I)
    batch_first[5], batch_first[6] = args[5].transpose(0, 1), args[6].transpose(0, 1)  # states (B, D, H)
    y1, y1_h, y1_c = OPS["LSTM"](batch_first, {"direction": "bidirectional", "hidden_size": 6, "layout": 1})
    torch.testing.assert_close(y1, y.permute(2, 0, 1, 3), rtol=0, atol=0)  # (B, T, D, H)
    torch.testing.assert_close(y1_h, y_h.transpose(0, 1), rtol=0, atol=0)
    torch.testing.assert_close(y1_c, y_c.transpose(0, 1), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("inputs", "attrs", "reason"),
    [
        (["x", "w", "r", "b", "", "", "", "p"], {}, "LSTM with peepholes"),
        (["x", "w", "r", "", "lens"], {}, "LSTM with sequence_lens"),
        (["x", "w", "r"], {"clip": 3.0}, "LSTM clip"),
        (["x", "w", "r"], {"input_forget": 1}, "LSTM input_forget 1"),
        (["x", "w", "r"], {"activations": ["Relu", "Tanh", "Tanh"]}, "LSTM activations"),
    ],
)
def test_lstm_variants_not_converted_say_which(inputs, attrs, reason) -> None:
    assert reason in unsupported(helper.make_node("LSTM", inputs, ["y"], hidden_size=4, **attrs))


def test_a_block_names_the_attribute_its_node_is_refused_for() -> None:
    # x → Conv → Resize (cubic) → y: the whole-graph block is unsupported with the Resize's reason, where
    # the op alone (Resize now has a converter) would not say why
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", kernel_shape=[1, 1]),
        helper.make_node("Resize", ["c", "", "scales"], ["y"], name="up", mode="cubic"),
        helper.make_node("Softplus", ["y"], ["z"], name="soft"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(image(2, 2, 1, 1), "w"), numpy_helper.from_array(floats(1, 1, 2, 2), "scales")],
    )
    annotation = SimpleNamespace(parameters=frozenset({"w"}))  # whole_graph reads the parameters alone
    assert whole_graph(graph, annotation).unsupported == (
        "Resize mode 'cubic': only nearest and linear are converted",
        "Softplus: no torch converter",
    )
