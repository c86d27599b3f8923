"""QAT's step on each trained tensor relative to that tensor's size per channel
(``GraphModule.relative_step``), inputs and outputs whose samples are not on axis 0 (a recurrent state
(2, batch, H), a constant input) held sample-major and trained on (``quantcore.qat.layout``), and a
Sqrt whose gradient stays finite at 0."""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from quantcore import AnalysisOptions, QuantizeConfig, annotate, calibrate, prepare
from quantcore.config import QatConfig
from quantcore.graph.index import GraphIndex
from quantcore.qat import qat
from quantcore.qat.graph_module import GraphModule
from quantcore.reconstruction.blocks import whole_graph
from quantcore.reconstruction.torch_ops import OPS
from tests.quantcore.test_qat import tiny_setup


def test_each_tensor_moves_by_lr_times_its_own_channel_rms() -> None:
    # Adam's first step moves every element with a gradient by exactly lr (m̂ / √v̂ = ±1); relative, each
    # weight channel moves by lr times that channel's RMS, and a bias by lr times its RMS (an all-zero
    # bias, as tiny_conv_model's: by lr), whatever their sizes
    prepared, annotation, data, _ = tiny_setup()
    index = GraphIndex(prepared.model.graph)
    module = GraphModule(
        whole_graph(prepared.model.graph, annotation), index, annotation, annotation.configs,
        learn_scales=False, device=torch.device("cpu"),
    )  # fmt: skip
    lr = 1e-3
    optimizer = torch.optim.Adam(module.tensors.values(), lr=lr)
    outputs = module({"image": torch.from_numpy(data["image"][:8])})
    sum(o.square().sum() for o in outputs).backward()
    previous = module.state()
    optimizer.step()
    module.relative_step(previous)
    for name, key in module.tensor_keys.items():
        initial = previous[f"tensors.{key}"]
        moved = (module.tensors[key].detach() - initial).abs()
        tqc = annotation.configs.get(name)
        if initial.ndim >= 2 and tqc is not None and tqc.per_channel:
            others = tuple(a for a in range(initial.ndim) if a != tqc.channel_axis)
            rms = initial.square().mean(dim=others, keepdim=True).sqrt()
        else:
            rms = initial.square().mean().sqrt()
        rms = torch.where(rms > 0, rms, torch.ones_like(rms))
        expected = (lr * rms).expand_as(moved)
        stepped = moved > 0  # elements whose gradient was not 0 (a clipped weight's is)
        assert stepped.any(), name
        # float32 (previous + Δ) - previous: Δ to within a few ulps of the tensor's values
        torch.testing.assert_close(moved[stepped], expected[stepped], rtol=1e-3, atol=1e-7)


def test_each_log_scale_moves_by_scale_lr_steps_of_its_grid() -> None:
    # a log-scale u of a grid of L = quant_max - quant_min steps moves by scale_lr / L on Adam's first step:
    # its range L·s moves by about scale_lr quantization steps, at 4 bits (L = 15) as at 8 (L = 255)
    prepared, annotation, data, _ = tiny_setup()
    module = GraphModule(
        whole_graph(prepared.model.graph, annotation), GraphIndex(prepared.model.graph), annotation,
        annotation.configs, learn_scales=True, device=torch.device("cpu"),
    )  # fmt: skip
    scale_lr = 2e-2
    optimizer = torch.optim.Adam(module.scale_parameters(), lr=scale_lr)
    sum(o.square().sum() for o in module({"image": torch.from_numpy(data["image"][:8])})).backward()
    previous = module.state()
    optimizer.step()
    module.relative_step(previous)
    keys = {f"log_scales.{k}": r for r, k in module.scale_keys.items()}
    keys |= {f"weight_log_scales.{k}": n for n, k in module.weight_scale_keys.items()}
    assert keys
    parameters = dict(module.named_parameters())
    grids = set()
    for parameter, tensor in keys.items():
        tqc = annotation.configs[tensor]
        grids.add(steps := tqc.quant_max - tqc.quant_min)
        moved = (parameters[parameter].detach() - previous[parameter]).abs()
        stepped = moved > 0
        assert stepped.any(), parameter
        # float32 u = 0 + Δ: exact to 1e-4 relative
        torch.testing.assert_close(moved[stepped], torch.full_like(moved[stepped], scale_lr / steps), rtol=1e-4, atol=0)
    assert grids == {15, 255}  # W4A4, the graph input kept at 8 bits by the academic platform


def recurrent_model() -> onnx.ModelProto:
    """x (N, 4) and state (2, N, 3) and gain (a scalar, no batch axis) →
    y = x·W + state[0] · gain (N, 3), state_out = state · gain (2, N, 3)."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"], name="matmul"),
        helper.make_node("Gather", ["state", "zero"], ["first"], name="first", axis=0),
        helper.make_node("Mul", ["first", "gain"], ["scaled"], name="scaled"),
        helper.make_node("Add", ["xw", "scaled"], ["y"], name="add"),
        helper.make_node("Mul", ["state", "gain"], ["state_out"], name="state_out"),
    ]
    graph = helper.make_graph(
        nodes,
        "recurrent",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "N", 3]),
            helper.make_tensor_value_info("gain", TensorProto.FLOAT, []),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("state_out", TensorProto.FLOAT, [2, "N", 3]),
        ],
        [
            numpy_helper.from_array(rng.normal(size=(4, 3)).astype(np.float32), "w"),
            numpy_helper.from_array(np.array(0, np.int64), "zero"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def test_a_state_batched_on_axis_1_and_a_constant_input_are_trained_on() -> None:
    rng = np.random.default_rng(1)
    data = {
        "x": rng.uniform(-1, 1, (48, 4)).astype(np.float32),
        "state": rng.uniform(-1, 1, (2, 48, 3)).astype(np.float32),
        "gain": np.array(0.5, np.float32),
    }
    config = QuantizeConfig(
        platform="academic",
        precision="w4a4",
        observer="minmax",
        cpu_latency=False,
        analysis=AnalysisOptions(enabled=False),
        qat=QatConfig(epochs=2, batch_size=8, num_samples=48, threads=1, lr=1e-2),
    )
    prepared = prepare(recurrent_model())
    annotation = calibrate(prepared, annotate(prepared, config), data, config)
    result = qat(prepared, annotation, data, config)
    # both outputs distilled (state_out's samples found on axis 1); 10 of the 48 samples held out
    assert result.status == "trained", result.reason
    assert set(result.outputs) == {"y", "state_out"}
    assert (result.num_train, result.num_heldout) == (38, 10)
    assert result.after_sqnr_db > result.before_sqnr_db


def test_sqrt_has_a_finite_gradient_at_zero_and_nan_below() -> None:
    x = torch.tensor([0.0, 1e-40, 4.0, -1.0], requires_grad=True)
    (y,) = OPS["Sqrt"]([x], {})
    y[:3].sum().backward()
    value = y.detach()
    assert value[2] == 2.0 and torch.isnan(value[3]) and float(value[0]) < 1e-18
    assert torch.isfinite(x.grad).all() and x.grad[0] == 0 and x.grad[2] == 0.25
