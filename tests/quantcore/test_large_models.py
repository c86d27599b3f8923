"""Models beyond protobuf's 2 GiB (``quantcore.graph.protobuf``), and the memory plan of a run and of its
analysis (``quantcore.runtime.memory_plan``)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper

import quantcore.runtime.memory_plan
from quantcore import QuantizeConfig, quantize
from quantcore.config import AccuracyTarget, AnalysisOptions, ReconstructionConfig
from quantcore.errors import UnsupportedModelError
from quantcore.graph.protobuf import fits_in_protobuf, initializer_bytes, skeleton
from quantcore.runtime.memory_plan import RUN_FACTOR, WITH_CONES, WITHOUT_CONES, available_bytes, plan_memory
from samples.large import EMBEDDING_VOCAB, embedding_model, matmul_chain, table_bytes
from samples.zoo import build


def chain(layers: int, width: int) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    return matmul_chain(
        layers,
        width,
        lambda i: numpy_helper.from_array(
            rng.normal(scale=width**-0.5, size=(width, width)).astype(np.float32), f"w{i}"
        ),
    )


def test_a_model_beyond_2_gib_quantizes_exports_and_runs(tmp_path) -> None:
    """Every stage but the analysis (its memory is ``plan_memory``'s to decide, tested below) on a real
    2.16 GB model: protobuf cannot serialise it, nor measure it, so each session gets its skeleton and
    the table beside it, and shape inference its skeleton. Before, calibration died in protobuf
    ("Failed to serialize proto") and shape inference failed with a warning."""
    source, rows = embedding_model(tmp_path, hidden=32)
    ids = np.random.default_rng(2).integers(0, EMBEDDING_VOCAB, size=(24, 16), dtype=np.int64)
    config = QuantizeConfig(platform="tensorrt", analysis=AnalysisOptions(enabled=False), cpu_latency=False)
    result = quantize(source, {"ids": ids[:16]}, {"ids": ids[16:]}, config, tmp_path / "out")

    # the table is read by a Gather, not quantized: the export is past 2 GiB too, its weights beside it
    assert result.model_data_path == result.model_path.with_name("model.qdq.onnx.data")
    assert result.model_data_path.stat().st_size > table_bytes()
    report = result.report
    assert not [w for w in report["warnings"] if "shape inference" in w], report["warnings"]
    sqnr = report["evaluation"]["qdq_exact"]["outputs"]["output"]["sqnr_db"]
    assert sqnr > 25, sqnr  # int8 activations and weights of one MatMul: some 30-40 dB; a broken run is far off
    # the exported model runs from its directory, as a user would run it, and agrees with FP32 math; its
    # Q/DQ computed as written (no fusion: without VNNI the fused u8s8 kernels round otherwise, as deployed)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(result.model_path), options, providers=["CPUExecutionProvider"])
    got = session.run(None, {"ids": ids[16:]})[0]
    weight = numpy_helper.to_array(onnx.load(source, load_external_data=False).graph.initializer[1])
    expected = np.maximum(rows[ids[16:] % 1000] @ weight, 0)
    error = got - expected
    # the report's exact-Q/DQ SQNR is of the same outputs, so the exported model reproduces it to rounding
    assert 10 * np.log10((expected**2).sum() / (error**2).sum()) == pytest.approx(sqnr, abs=0.05)


def test_the_skeleton_holds_everything_but_the_large_tensors() -> None:
    model = chain(3, 512)  # 1 MiB weights: detached; 2 KiB biases: kept
    header, detached = skeleton(model)
    assert fits_in_protobuf(model) and initializer_bytes(model) == 3 * (512 * 512 + 512) * 4
    assert [t.name for t in detached] == ["w0", "w1", "w2"]
    stubs = {t.name: t for t in header.graph.initializer if t.data_location == TensorProto.EXTERNAL}
    assert set(stubs) == {t.name for t in detached}
    for tensor in detached:
        assert list(stubs[tensor.name].dims) == list(tensor.dims) and not stubs[tensor.name].raw_data
    assert header.graph.node == model.graph.node and header.opset_import == model.opset_import
    assert header.graph.input == model.graph.input and header.graph.output == model.graph.output
    assert [t for t in header.graph.initializer if t.name.startswith("b")] == list(model.graph.initializer)[1::2]
    assert header.ByteSize() < 10_000


@pytest.mark.parametrize(
    ("available_weights", "cones", "skipped"),
    [(WITH_CONES, True, False), (WITH_CONES - 1, False, False), (WITHOUT_CONES - 1, False, True)],
)
def test_the_memory_plan_drops_cones_then_the_analysis(available_weights, cones, skipped) -> None:
    model = chain(3, 64)
    weights = initializer_bytes(model)
    plan = plan_memory(model, available=available_weights * weights)
    assert (plan.cones, plan.skip is not None) == (cones, skipped)
    if skipped:
        assert "skipped" in plan.skip and "MiB" in plan.skip and f"{WITHOUT_CONES} times" in plan.skip


def test_a_run_that_would_not_fit_is_refused_before_the_slow_stages(tmp_path, monkeypatch) -> None:
    model = chain(3, 512)  # 3 MiB of weights
    weights = initializer_bytes(model)
    monkeypatch.setattr(quantcore.runtime.memory_plan, "resident_bytes", lambda: weights)
    assert plan_memory(model, available=(RUN_FACTOR - 1) * weights).skip is not None  # fits, just
    with pytest.raises(UnsupportedModelError, match=r"needs about 12 MiB of memory \(4 times its 3 MiB of weights"):
        plan_memory(model, available=(RUN_FACTOR - 1) * weights - 1)
    monkeypatch.setattr(quantcore.runtime.memory_plan, "available_bytes", lambda: weights)
    path = tmp_path / "chain.onnx"
    onnx.save_model(model, str(path))
    x = np.random.default_rng(0).normal(size=(8, 512)).astype(np.float32)
    events = []
    with pytest.raises(UnsupportedModelError, match="this worker holds"):
        quantize(
            path, {"input": x}, {"input": x}, QuantizeConfig(), tmp_path / "out", progress=lambda *e: events.append(e)
        )
    assert [e[0] for e in events] == ["prepare"]


def test_available_memory_is_the_lesser_of_the_machine_and_the_cgroup(tmp_path, monkeypatch) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:    8000000 kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    monkeypatch.setattr(quantcore.runtime.memory_plan, "MEMINFO", meminfo)
    monkeypatch.setattr(quantcore.runtime.memory_plan, "CGROUP", cgroup)
    assert available_bytes() == 8000000 * 1024  # no cgroup files: the machine's
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "memory.current").write_text("1000\n")
    assert available_bytes() == 8000000 * 1024  # an unlimited group
    (cgroup / "memory.max").write_text(f"{4 << 30}\n")
    assert available_bytes() == (4 << 30) - 1000  # a container's limit, less what the group uses
    monkeypatch.setattr(quantcore.runtime.memory_plan, "MEMINFO", tmp_path / "absent")
    monkeypatch.setattr(quantcore.runtime.memory_plan, "CGROUP", tmp_path / "absent")
    assert available_bytes() is None


def test_without_the_memory_the_analysis_is_skipped_and_the_report_says_why(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(quantcore.runtime.memory_plan, "available_bytes", lambda: 1000)
    x = np.random.default_rng(0).normal(size=(16, 64)).astype(np.float32)
    model = tmp_path / "chain.onnx"
    onnx.save_model(chain(3, 64), str(model))
    events = []
    config = QuantizeConfig(platform="tensorrt", cpu_latency=False)
    result = quantize(model, {"input": x}, {"input": x}, config, tmp_path / "out", progress=lambda *e: events.append(e))
    assert result.report["analysis"] is None
    skip = [w for w in result.report["warnings"] if "layer-wise analysis was skipped" in w]
    assert len(skip) == 1 and "available" in skip[0]
    assert ("analyze", 1.0, skip[0]) in events
    # an accuracy target needs the analysis's ranking: refused before the slow stages
    events.clear()
    target = QuantizeConfig(platform="tensorrt", target=AccuracyTarget(metric="sqnr", threshold=60))
    with pytest.raises(UnsupportedModelError, match="accuracy target needs the layer-wise ranking"):
        quantize(model, {"input": x}, {"input": x}, target, tmp_path / "out2", progress=lambda *e: events.append(e))
    assert not [e for e in events if e[0] == "calibrate"]


def test_without_memory_for_cones_the_layer_wise_runs_are_whole(tmp_path, monkeypatch) -> None:
    x = np.random.default_rng(0).normal(size=(4, 64)).astype(np.float32)
    model = tmp_path / "chain.onnx"
    onnx.save_model(chain(12, 64), str(model))  # 12 layers: cones in 2 groups
    weights = initializer_bytes(chain(12, 64))
    config = QuantizeConfig(platform="tensorrt", cpu_latency=False)
    runs = {}
    for label, factor in (("cones", WITH_CONES), ("whole", WITH_CONES - 1)):
        monkeypatch.setattr(quantcore.runtime.memory_plan, "available_bytes", lambda f=factor: f * weights)
        layerwise = quantize(model, {"input": x}, {"input": x}, config, tmp_path / label).report["analysis"][
            "layerwise"
        ]
        runs[label] = layerwise["runs_per_batch"] - layerwise["layers_analyzed"]  # the reference runs
    assert runs["cones"] >= 2 and runs["whole"] == 1


@pytest.mark.parametrize("name", ["resnet", "transformer", "chain", "chain-qdrop"])
def test_models_handled_as_beyond_the_limit_give_the_same_report(tmp_path, monkeypatch, name) -> None:
    """Every session a run builds from a ModelProto (prepare's check, calibration with its exposed
    tensors, the clip search, reconstruction's FP32 and per-block sessions, the analysis) built from
    skeletons and detached weights, as for a model beyond 2 GiB, measures exactly what the same run of
    whole models measures. (Evaluation opens the files.) The chains have the calibration samples the clip
    search needs."""
    import quantcore.graph.protobuf
    import quantcore.runtime.session

    config = QuantizeConfig(platform="tensorrt", cpu_latency=False)
    if name.startswith("chain"):
        x = np.random.default_rng(0).normal(size=(96, 64)).astype(np.float32)
        proto, calibration, evaluation = chain(12, 64), {"input": x[:80]}, {"input": x[80:]}
        if name == "chain-qdrop":
            recipe = ReconstructionConfig(method="qdrop", iters=20, batch_size=16, num_samples=64)
            config = QuantizeConfig(platform="academic", cpu_latency=False, reconstruction=recipe)
    else:
        zoo = build(name)
        proto, calibration, evaluation = zoo.model, zoo.calibration, zoo.evaluation
    path = tmp_path / f"{name}.onnx"
    onnx.save_model(proto, str(path))
    whole = quantize(path, calibration, evaluation, config, tmp_path / "whole").report
    monkeypatch.setattr(quantcore.graph.protobuf, "PROTOBUF_LIMIT", 1000)
    monkeypatch.setattr(quantcore.graph.protobuf, "DETACHED_TENSOR_BYTES", 64)
    detached_weights = []

    def counted(model: onnx.ModelProto):
        header, tensors = skeleton(model)
        detached_weights.append(len(tensors))
        return header, tensors

    monkeypatch.setattr(quantcore.runtime.session, "skeleton", counted)
    detached = quantize(path, calibration, evaluation, config, tmp_path / "detached").report
    assert min(detached_weights) > 0  # each session with weights beside it
    # prepare, calibrate, the analysis's two models; the FP32 model and 5 candidates of the clip search;
    # reconstruction's FP32 model and one quantized model per block
    blocks = len((detached["reconstruction"] or {}).get("blocks", []))
    assert len(detached_weights) == {"chain": 10, "chain-qdrop": 10 + 1 + blocks}.get(name, 4)
    if name == "chain-qdrop":  # the same losses, block by block, and the same learned model (below)
        untimed = [
            [{k: v for k, v in b.items() if k != "seconds"} for b in r["reconstruction"]["blocks"]]
            for r in (detached, whole)
        ]
        assert untimed[0] == untimed[1] and blocks >= 2
    assert detached["evaluation"]["qdq_exact"] == whole["evaluation"]["qdq_exact"]
    assert detached["evaluation"]["qdq_deployed"] == whole["evaluation"]["qdq_deployed"]
    assert detached["calibration"] == whole["calibration"]
    assert [r["sqnr_db"] for r in detached["analysis"]["layers"]] == [r["sqnr_db"] for r in whole["analysis"]["layers"]]
