"""Reconstruction on tiny graphs: partition, learned rounding, determinism, QDrop/BRECQ equivalence at
p = 0, exact baking into the exported QDQ model, and unconvertible blocks left at round-to-nearest."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from quantcore import (
    QuantizeConfig,
    ReconstructionConfig,
    annotate,
    calibrate,
    export,
    prepare,
    quantize,
    reconstruct,
)
from quantcore.errors import Canceled, UnsupportedModelError
from quantcore.graph.index import GraphIndex
from quantcore.numerics.fake_quant import quantize_array
from quantcore.numerics.tqc import QuantState, TensorQuantConfig
from quantcore.reconstruction import partition
from quantcore.reconstruction.adaround import AdaRoundWeight, beta_at
from quantcore.reconstruction.converter import BlockModule
from quantcore.runtime.session import open_session
from samples.digits import load_dataset
from samples.tiny import stateful_data, stateful_model, tiny_conv_model

C = 6  # channels of the tiny residual model


def residual_model(path, *, middle: str = "Relu", seed: int = 0, batch: int | str = "N") -> None:
    """x (N,3,6,6) → Conv0 → Relu0 = t → Conv1 → <middle> → Conv2 → Add(t) → Relu2 → GAP → Flatten → Gemm.

    t is read by Conv1 and by the Add: a multi-consumer tensor and a residual connection."""
    rng = np.random.default_rng(seed)

    def init(name, *shape, scale=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    conv = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="conv0", **conv),
        helper.make_node("Relu", ["c0"], ["t"], name="relu0"),
        helper.make_node("Conv", ["t", "w1", "b1"], ["c1"], name="conv1", **conv),
        helper.make_node(middle, ["c1"], ["m1"], name="middle"),
        helper.make_node("Conv", ["m1", "w2", "b2"], ["c2"], name="conv2", **conv),
        helper.make_node("Add", ["c2", "t"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["r"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wh", "bh"], ["logits"], name="head", transB=1),
    ]
    initializers = [
        init("w0", C, 3, 3, 3),
        init("b0", C, scale=0.1),
        init("w1", C, C, 3, 3, scale=0.2),
        init("b1", C, scale=0.1),
        init("w2", C, C, 3, 3, scale=0.2),
        init("b2", C, scale=0.1),
        init("wh", 4, C),
        init("bh", 4, scale=0.1),
    ]
    graph = helper.make_graph(
        nodes,
        "residual",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 6, 6])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 4])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(path))


CONFIG = QuantizeConfig(platform="academic", precision="w4a4", observer="minmax", cpu_latency=False)
DATA = {"x": np.random.default_rng(1).uniform(-1, 1, (128, 3, 6, 6)).astype(np.float32)}


def recon(method: str, **kwargs) -> QuantizeConfig:
    options = {"iters": 150, "batch_size": 16, "num_samples": 128, "threads": 1, **kwargs}
    return QuantizeConfig(
        platform="academic",
        precision="w4a4",
        observer="minmax",
        cpu_latency=False,
        reconstruction=ReconstructionConfig(method=method, **options),
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("recon") / "residual.onnx"
    residual_model(path)
    prepared = prepare(path)
    annotation = calibrate(prepared, annotate(prepared, CONFIG), DATA, CONFIG)
    return prepared, annotation


def test_partition_keeps_the_residual_block_together(tiny) -> None:
    prepared, annotation = tiny
    blocks = partition(prepared.model.graph, annotation, blockwise=True)
    # the stem alone (a residual block follows it), the residual block ending at its activation, the
    # head alone (nothing follows to group it with) with the pooling before it: a block's loss is on its
    # last layer's output, not on pooled features
    assert [(b.kind, b.node_names) for b in blocks] == [
        ("layer", ["conv0", "relu0"]),
        ("residual", ["conv1", "middle", "conv2", "add", "relu2"]),
        ("layer", ["gap", "flatten", "head"]),
    ]
    residual = blocks[1]
    assert residual.inputs == ("t",)  # the multi-consumer tensor enters once, read twice inside
    assert residual.outputs == ("r",) and residual.weights == ("w1", "w2")
    layers = partition(prepared.model.graph, annotation, blockwise=False)
    assert [b.node_names for b in layers] == [["conv0", "relu0"], ["conv1", "middle"], ["conv2"], ["head"]]


def test_partition_keeps_the_output_layer_alone(tmp_path) -> None:
    # Conv → Relu → GAP → Flatten → Gemm(logits): two single-layer units, which the grouping rule would
    # merge; the Gemm produces the graph output, so it is a block of its own (BRECQ's final FC layer)
    path = tmp_path / "chain.onnx"
    onnx.save(tiny_conv_model(), str(path))
    prepared = prepare(path)
    calibration = {"image": np.random.default_rng(0).uniform(-1, 1, (16, 3, 8, 8)).astype(np.float32)}
    annotation = calibrate(prepared, annotate(prepared, CONFIG), calibration, CONFIG)
    blocks = partition(prepared.model.graph, annotation, blockwise=True)
    assert [(b.kind, b.node_names) for b in blocks] == [
        ("layer", ["conv", "relu"]),
        ("layer", ["pool", "flatten", "fc"]),
    ]


def test_hardened_values_are_floor_or_ceil_and_export_exactly() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((5, 4, 3, 3)).astype(np.float32)
    lo, hi = w.reshape(5, -1).min(1), w.reshape(5, -1).max(1)
    scale = ((hi - lo) / 15).astype(np.float32)
    offset = np.round(-lo / scale).astype(np.int64)
    tqc = TensorQuantConfig(num_bits=4, symmetric=False, per_channel=True, channel_axis=0, observer="minmax")
    tqc = tqc.with_scale(scale, offset, state=QuantState.ACTIVATED)
    weight = AdaRoundWeight(w, tqc, torch.device("cpu"))
    with torch.no_grad():
        weight.v.copy_(torch.from_numpy(rng.standard_normal(w.shape).astype(np.float32) * 3))
    weight.harden()
    values = weight.grid_values()
    codes = quantize_array(values, tqc).astype(np.int64)  # what the exporter stores
    s, o = scale.reshape(-1, 1, 1, 1), offset.reshape(-1, 1, 1, 1)
    # exact: (q - o)·s in float32 divided by s rounds back to the same integer q
    np.testing.assert_array_equal((codes - o).astype(np.float32) * s, values)
    floor = np.floor(w / s)
    unclipped = (codes - o == floor) | (codes - o == floor + 1)
    clipped = (codes == 0) | (codes == 15)
    assert np.all(unclipped | clipped)
    assert np.any(codes - o == floor) and np.any(codes - o == floor + 1)  # both directions were chosen


def test_beta_schedule() -> None:
    assert beta_at(19, 100, warmup=0.2, beta_start=20, beta_end=2) is None
    assert beta_at(20, 100, warmup=0.2, beta_start=20, beta_end=2) == 20
    assert beta_at(100, 100, warmup=0.2, beta_start=20, beta_end=2) == 2


def test_brecq_lowers_the_residual_block_loss_and_export_reproduces_it(tiny, tmp_path) -> None:
    prepared, annotation = tiny
    # 300 steps: this random model's block losses are small (~1e-2) against λ·R(V), so at 150 steps the
    # rounding loss still dominates and the block keeps round-to-nearest (measured; 300 steps lower it 40 %)
    result = reconstruct(prepared, annotation, DATA, recon("brecq", iters=300))
    residual = next(b for b in result.blocks if "add" in b.nodes)
    assert residual.status == "reconstructed"
    assert residual.loss_after < residual.loss_before
    exported = export(result.prepared, result.annotation, tmp_path)
    qdq = onnx.load(str(exported.model_path))
    # every learned weight is baked exactly: DequantizeLinear of the stored codes gives the grid values
    index = GraphIndex(result.prepared.model.graph)
    with open_session(qdq, exact_qdq=True) as session:
        names = [f"{w}_dequantized" for w in ("w1", "w2")]
        probe = onnx.ModelProto()
        probe.CopyFrom(qdq)
        probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
        with open_session(probe, exact_qdq=True) as probing:
            dequantized = probing.run(names, {"x": DATA["x"][:1]})
        for name, value in zip(("w1", "w2"), dequantized, strict=True):
            np.testing.assert_array_equal(value, index.array(name))  # bit-exact, no tolerance
        logits = session.run(["logits"], DATA)[0]
    # The last block ends at the logits: ONNX Runtime's exported model gives the same loss as the torch
    # simulation measured (float32 accumulation order differs: 1e-4 relative)
    with open_session(prepared.model) as fp32:
        reference = fp32.run(["logits"], DATA)[0]
    last = result.blocks[-1]
    assert "head" in last.nodes
    exported_loss = float(((logits - reference) ** 2).sum(1).mean())
    assert exported_loss == pytest.approx(last.loss_after, rel=1e-4)
    assert result.annotation.configs["t"].scale != annotation.configs["t"].scale  # learned activation scale


def test_qdrop_without_dropping_equals_brecq_and_runs_are_deterministic(tiny) -> None:
    prepared, annotation = tiny
    brecq = reconstruct(prepared, annotation, DATA, recon("brecq", iters=40))
    qdrop0 = reconstruct(prepared, annotation, DATA, recon("qdrop", iters=40, drop_prob=0.0))
    qdrop = reconstruct(prepared, annotation, DATA, recon("qdrop", iters=40))
    again = reconstruct(prepared, annotation, DATA, recon("qdrop", iters=40))

    def state(result):
        index = GraphIndex(result.prepared.model.graph)
        weights = {w: index.array(w) for w in sorted(result.annotation.parameters)}
        scales = {t: np.asarray(c.scale) for t, c in result.annotation.configs.items()}
        return weights, scales

    for a, b in [(state(brecq), state(qdrop0)), (state(qdrop), state(again))]:
        for name in a[0]:
            np.testing.assert_array_equal(a[0][name], b[0][name])  # identical, not close
        for name in a[1]:
            np.testing.assert_array_equal(a[1][name], b[1][name])
    assert [b.loss_after for b in brecq.blocks] == [b.loss_after for b in qdrop0.blocks]
    assert [b.loss_after for b in qdrop.blocks] != [b.loss_after for b in brecq.blocks]  # p = 0.5 does differ


def test_qdrop_drops_a_block_input_to_fp32_even_when_its_quantizer_is_inside_the_block(tmp_path) -> None:
    # x → Conv → Relu = r → ReduceMean → g → Gemm: the head block's input r is read unquantized (its
    # Q/DQ is on the pooled g), yet g's dropped elements are the FP32 model's pooled values, as QDrop's
    # code mixes each block's FP32 and quantized inputs, not g's own unquantized value. At p = 1 every
    # element is dropped, so the block's output depends on the FP32 input only, not on the quantized one.
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("ReduceMean", ["r"], ["g"], name="mean", axes=[2, 3], keepdims=0),
        helper.make_node("Gemm", ["g", "wh", "bh"], ["logits"], name="head", transB=1),
    ]
    shapes = {"w": (C, 3, 3, 3), "b": (C,), "wh": (4, C), "bh": (4,)}
    initializers = [
        numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.3, name)
        for name, shape in shapes.items()
    ]
    graph = helper.make_graph(
        nodes,
        "pooled_head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 6, 6])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 4])],
        initializers,
    )
    path = tmp_path / "pooled.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), str(path))
    prepared = prepare(path)
    annotation = calibrate(prepared, annotate(prepared, CONFIG), DATA, CONFIG)
    head = partition(prepared.model.graph, annotation, blockwise=True)[-1]
    assert head.node_names == ["mean", "head"] and head.inputs == ("r",)
    assert "r" not in annotation.configs and "g" in annotation.configs  # quantized after the pooling only
    index = GraphIndex(prepared.model.graph)
    weights = {name: index.array(name).astype(np.float32) for name in head.weights}
    module = BlockModule(
        head, index, annotation, annotation.configs, weights, learn=set(head.weights), learned=set(),
        device=torch.device("cpu"),
    )  # fmt: skip
    module.train()
    module.drop_prob = 1.0
    fp = torch.from_numpy(rng.uniform(0, 1, (8, C, 6, 6)).astype(np.float32))
    quantized = fp + 0.25  # the quantized model's input, off by an error the FP32 input does not have
    [mixed] = module({"r": quantized}, {"r": fp})
    [clean] = module({"r": fp}, {"r": fp})
    torch.testing.assert_close(mixed, clean, rtol=0, atol=0)  # identical: no element of the error left
    module.drop_prob = 0.0
    [kept] = module({"r": quantized}, {"r": fp})
    assert not torch.equal(kept, clean)  # without dropping the error does reach the output


def test_unconvertible_block_stays_at_round_to_nearest_with_a_warning(tmp_path) -> None:
    path = tmp_path / "softplus.onnx"
    residual_model(path, middle="Softplus")  # no torch converter for Softplus
    prepared = prepare(path)
    annotation = calibrate(prepared, annotate(prepared, CONFIG), DATA, CONFIG)
    result = reconstruct(prepared, annotation, DATA, recon("brecq", iters=20))
    residual = next(b for b in result.blocks if "add" in b.nodes)
    assert residual.status == "unsupported" and "Softplus" in residual.warning
    index, original = GraphIndex(result.prepared.model.graph), GraphIndex(prepared.model.graph)
    np.testing.assert_array_equal(index.array("w1"), original.array("w1"))  # left as it was
    assert any("Softplus" in w for w in result.warnings)


def test_cancel_and_progress(tiny) -> None:
    prepared, annotation = tiny
    events = []
    with pytest.raises(Canceled):
        reconstruct(
            prepared,
            annotation,
            DATA,
            recon("adaround", iters=100),
            progress=lambda *e: events.append(e),
            should_cancel=lambda: len(events) >= 3,
        )
    assert all(stage == "reconstruct" for stage, _, _ in events)
    assert "step" in events[-1][2]


def test_disk_cache_gives_the_same_result(tiny) -> None:
    prepared, annotation = tiny
    memory = reconstruct(prepared, annotation, DATA, recon("adaround", iters=30))
    disk = reconstruct(prepared, annotation, DATA, recon("adaround", iters=30, cache_bytes=0))
    assert {b.cache for b in disk.blocks if b.cache} == {"disk"}
    assert [b.loss_after for b in memory.blocks] == [b.loss_after for b in disk.blocks]


def test_a_fixed_batch_dimension_is_respected(tmp_path) -> None:
    path = tmp_path / "fixed.onnx"
    residual_model(path, batch=8)
    prepared = prepare(path)
    annotation = calibrate(prepared, annotate(prepared, CONFIG), DATA, CONFIG)
    result = reconstruct(prepared, annotation, DATA, recon("brecq", iters=10, num_samples=100))
    assert result.num_samples == 96  # whole batches of 8 only
    assert all(b.status in ("reconstructed", "kept_nearest") for b in result.blocks)


def test_inputs_batched_off_axis_0_are_refused_by_name() -> None:
    model = stateful_model()  # samples on axis 1 of `state`; `sr` is a constant input
    prepared = prepare(model)
    config = recon("brecq", iters=10)
    annotation = calibrate(prepared, annotate(prepared, config), stateful_data(32, seed=0), config)
    with pytest.raises(UnsupportedModelError, match=r"'state': 1.*'sr': None"):
        reconstruct(prepared, annotation, stateful_data(32, seed=0), config)


@pytest.mark.parametrize(
    ("field", "value"),
    [("method", "sgd"), ("iters", 0), ("iters", 100_001), ("drop_prob", 1.5), ("batch_size", 0), ("beta_end", 30.0)],
)
def test_config_refuses_bad_values(field, value) -> None:
    with pytest.raises(ValueError, match=f"reconstruction.{field}"):
        ReconstructionConfig(**{field: value})


def test_quantize_runs_the_reconstruct_stage_and_reports_it(tmp_path) -> None:
    path = tmp_path / "residual.onnx"
    residual_model(path)
    events = []
    result = quantize(
        path, DATA, DATA, recon("adaround", iters=20), tmp_path / "out", progress=lambda *e: events.append(e)
    )
    stages = [stage for stage, _, _ in events]
    assert stages.index("calibrate") < stages.index("reconstruct") < stages.index("export")
    section = result.report["reconstruction"]
    assert section["method"] == "adaround" and section["num_samples"] == 128
    assert [b["nodes"] for b in section["blocks"]] == [["conv0", "relu0"], ["conv1", "middle"], ["conv2"], ["head"]]
    assert all(b["status"] in ("reconstructed", "kept_nearest") for b in section["blocks"])
    assert result.report["config"]["reconstruction"]["iters"] == 20


def test_reconstruction_reads_its_block_inputs_from_a_relu6_model_at_4_bits(digits_mobilenet) -> None:
    """MobileNet's ReLU6 (a Clip) before 4-bit quantizers: ONNX Runtime 1.32 refuses to build such a QDQ
    model at full optimization (its ClipQuantRewrite), so the block inputs come from exact Q/DQ sessions
    at basic optimization, which also keep every rewrite away from exact arithmetic."""
    images = load_dataset(0)[0][:64]
    config = QuantizeConfig(
        platform="academic",
        precision="w4a4",
        cpu_latency=False,
        reconstruction=ReconstructionConfig(method="brecq", iters=5, num_samples=64, threads=1),
    )
    prepared = prepare(digits_mobilenet)
    annotation = calibrate(prepared, annotate(prepared, config), {"input": images}, config)
    result = reconstruct(prepared, annotation, {"input": images}, config)
    assert any(block.status == "reconstructed" for block in result.blocks)


def sequence_first_model(path, *, length: int = 5, width: int = 8) -> None:
    """x (N, L, D) → Transpose → t (L, N, D) → MatMul → Relu → MatMul → Add(t) → Transpose → y (N, L, D):
    inside, the samples are on axis 1, as in a transformer exported sequence-first."""
    rng = np.random.default_rng(3)
    weights = [
        numpy_helper.from_array((rng.standard_normal((width, width)) * 0.4).astype(np.float32), f"w{i}") for i in (1, 2)
    ]
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], name="to_sequence_first", perm=[1, 0, 2]),
        helper.make_node("MatMul", ["t", "w1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["o"], name="mm2"),
        helper.make_node("Add", ["o", "t"], ["s"], name="residual"),
        helper.make_node("Transpose", ["s"], ["y"], name="to_batch_first", perm=[1, 0, 2]),
    ]
    graph = helper.make_graph(
        nodes,
        "sequence_first",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", length, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", length, width])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(path))


def test_blocks_whose_tensors_hold_samples_off_axis_0_learn_a_run_at_a_time(tmp_path) -> None:
    path = tmp_path / "sequence_first.onnx"
    sequence_first_model(path)
    data = {"x": np.random.default_rng(4).standard_normal((96, 5, 8)).astype(np.float32)}
    config = replace(recon("adaround", iters=200, num_samples=96), batch_size=16)
    prepared = prepare(path)
    annotation = calibrate(prepared, annotate(prepared, config), data, config)
    result = reconstruct(prepared, annotation, data, config)
    learned = [b for b in result.blocks if b.loss_before is not None]
    assert {b.nodes[0] for b in learned} == {"mm1", "mm2"}
    # AdaRound starts from round-to-nearest; a block that learned nothing better keeps it, so a lower
    # loss on some block is what shows the (L, N, D) runs were cached and trained on as the graph made them
    assert any(b.status == "reconstructed" and b.loss_after < b.loss_before for b in learned)
    assert result.num_samples == 96
