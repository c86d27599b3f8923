"""QAT's options beyond distillation of the outputs: a cross-entropy term on labels (``label_weight``),
random flips and crops of image batches with the FP32 targets computed again on them (``augment``), and
distillation of intermediate tensors (``intermediate``); each refused by name where the data or model
cannot serve it. The model is the tiny CNN of ``test_qat`` (image (N,3,8,8) → Conv → Relu "r" → pool →
Gemm → logits (N,2)), calibrated at W4A4."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from quantcore import AnalysisOptions, QuantizeConfig, annotate, calibrate, prepare, quantize
from quantcore.config import QatAugment, QatConfig
from quantcore.errors import Canceled, InvalidDataError
from quantcore.qat import qat
from quantcore.qat.augmentation import Augmentation
from quantcore.qat.checkpoint import Checkpointing
from quantcore.qat.distillation import Distillation
from quantcore.qat.training import _Samples, _Teacher
from quantcore.runtime.session import open_session
from samples.tiny import tiny_conv_model
from tests.quantcore.test_qat import Polls, tiny_setup

LABELS = np.random.default_rng(1).integers(0, 2, 40)  # one class id per sample of tiny_setup's 40


@pytest.fixture(scope="module")
def tiny():
    return tiny_setup()


def with_qat(config: QuantizeConfig, **options) -> QuantizeConfig:
    return replace(config, qat=replace(config.qat, **options))


# ---- labels ----


def test_the_label_term_is_the_weighted_cross_entropy_of_the_class_output() -> None:
    rng = np.random.default_rng(0)
    scores, target = rng.normal(size=(6, 5)).astype(np.float32), rng.normal(size=(6, 5)).astype(np.float32)
    labels = rng.integers(0, 5, 6)
    kinds, power = {"logits": "scores"}, {"logits": float((target**2).mean())}
    ys, ts = {"logits": torch.from_numpy(scores)}, {"logits": torch.from_numpy(target)}
    plain = float(Distillation("mse", kinds, power).loss(ys, ts))
    labelled = float(Distillation("mse", kinds, power, label_weight=0.5).loss(ys, ts, torch.from_numpy(labels)))
    log_softmax = scores - np.log(np.exp(scores).sum(1, keepdims=True))
    by_hand = -log_softmax[np.arange(6), labels].mean()
    # float32 log-softmax and mean over 6 samples against float64: 1e-5 relative
    assert labelled - plain == pytest.approx(0.5 * by_hand, rel=1e-5)


def test_a_label_loss_trains_on_the_labels_and_is_reported(tiny) -> None:
    prepared, annotation, data, config = tiny
    plain = qat(prepared, annotation, data, config)
    labelled = with_qat(config, label_weight=1.0)
    first = qat(prepared, annotation, data, labelled, labels=LABELS)
    assert first.epochs != plain.epochs  # the term enters every step's loss and gradient
    # the epoch-1 mean loss gains the cross-entropy of a 2-class head: well above 0 for labels drawn at random
    assert first.epochs[0].loss > plain.epochs[0].loss + 0.1
    assert qat(prepared, annotation, data, labelled, labels=LABELS).epochs == first.epochs  # deterministic
    assert first.summary()["label_weight"] == 1.0


def test_a_label_loss_without_labels_or_a_class_output_is_refused_by_name(tiny) -> None:
    prepared, annotation, data, config = tiny
    labelled = with_qat(config, label_weight=1.0)
    with pytest.raises(InvalidDataError, match=r"qat\.label_weight: a label loss needs labels"):
        qat(prepared, annotation, data, labelled)
    with pytest.raises(InvalidDataError, match=r"qat\.label_weight: labels range over 0\.\.2.*2 classes"):
        qat(prepared, annotation, data, labelled, labels=np.arange(40) % 3)
    prepared, annotation, data, config = regression_setup()
    with pytest.raises(InvalidDataError, match=r"qat\.label_weight: a label loss needs a class output"):
        qat(prepared, annotation, data, with_qat(config, label_weight=1.0), labels=np.zeros(40, np.int64))


def test_quantize_passes_the_calibration_labels_to_qat_and_checks_them_first(tiny, tmp_path) -> None:
    _, _, data, config = tiny
    config = with_qat(config, label_weight=1.0)
    evaluation = {"image": data["image"][:8]}
    model = tmp_path / "tiny.onnx"
    onnx.save(tiny_conv_model(), model)
    events: list[tuple] = []
    with pytest.raises(InvalidDataError, match=r"qat\.label_weight"):
        quantize(model, data, evaluation, config, tmp_path / "none", progress=lambda *e: events.append(e))
    assert {stage for stage, *_ in events} <= {"prepare"}  # refused before any slow stage
    result = quantize(model, data, evaluation, config, tmp_path / "labels", calibration_labels=LABELS)
    assert result.report["qat"]["label_weight"] == 1.0 and result.report["qat"]["status"] in ("trained", "kept_ptq")
    assert len(result.report["qat"]["curve"]) == 2


def regression_setup():
    """x (N, 4) → MatMul (4, 1) → y (N, 1): no class output, no image; calibrated at W4A4 on 40 samples."""
    weight = helper.make_tensor("w", TensorProto.FLOAT, [4, 1], [0.5, -1.0, 0.25, 2.0])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "regression",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    prepared = prepare(model)
    config = QuantizeConfig(
        platform="academic",
        precision="w4a4",
        cpu_latency=False,
        analysis=AnalysisOptions(enabled=False),
        qat=QatConfig(epochs=1, batch_size=8, threads=1),
    )
    data = {"x": np.random.default_rng(0).normal(size=(40, 4)).astype(np.float32)}
    return prepared, calibrate(prepared, annotate(prepared, config), data, config), data, config


# ---- augmentation ----


def shifted(sample: np.ndarray, pad: int, dy: int, dx: int, flip: bool) -> np.ndarray:
    """(C, H, W) zero-padded by ``pad``, the H x W window at (dy, dx), mirrored along W when ``flip``."""
    height, width = sample.shape[1:]
    window = np.pad(sample, ((0, 0), (pad, pad), (pad, pad)))[:, dy : dy + height, dx : dx + width]
    return window[..., ::-1] if flip else window


def test_augmentation_flips_and_shifts_each_sample_alike_in_every_input() -> None:
    rng = np.random.default_rng(0)
    batch = {
        "a": rng.normal(size=(16, 3, 6, 5)).astype(np.float32),
        "b": rng.normal(size=(16, 1, 6, 5)).astype(np.float32),
    }
    augmented = Augmentation(QatAugment(flip=True, crop_padding=2), seed=0).apply(batch)
    draws = []
    for i in range(16):
        # the one draw (dy, dx, flip) that gives sample i of "a"; copies of the input's values: exact equality
        [draw] = [
            (dy, dx, flip)
            for dy in range(5)
            for dx in range(5)
            for flip in (False, True)
            if np.array_equal(augmented["a"][i], shifted(batch["a"][i], 2, dy, dx, flip))
        ]
        assert np.array_equal(augmented["b"][i], shifted(batch["b"][i], 2, *draw))  # the same draw for "b"
        draws.append(draw)
    assert {flip for *_, flip in draws} == {False, True} and len({(dy, dx) for dy, dx, _ in draws}) > 4
    again = Augmentation(QatAugment(flip=True, crop_padding=2), seed=0).apply(batch)
    other = Augmentation(QatAugment(flip=True, crop_padding=2), seed=1).apply(batch)
    assert np.array_equal(again["a"], augmented["a"]) and not np.array_equal(other["a"], augmented["a"])


def test_augmented_batches_get_the_fp32_targets_of_what_they_now_show(tiny) -> None:
    prepared, _, data, _ = tiny
    with open_session(prepared.model) as session:
        teacher = _Teacher(session, prepared, ())
        augmentation = Augmentation(QatAugment(flip=True, crop_padding=1), seed=0)
        samples = _Samples(
            data, teacher.targets(data, 40, 40), None, 32, 8, 8, torch.device("cpu"), augmentation, teacher
        )
        inputs, targets, labels = samples.training(["logits"], np.arange(8))
        expected = session.run(["logits"], {"image": inputs["image"].numpy()})[0]
    assert labels is None and not np.array_equal(inputs["image"].numpy(), data["image"][:8])
    # the same session on the same input: bitwise the same logits, and not the stored ones of the originals
    assert np.array_equal(targets["logits"].numpy(), expected)
    assert not np.allclose(expected, samples.targets["logits"][:8])


def test_augmented_training_is_seeded_and_resumes_as_if_never_stopped(tiny, tmp_path) -> None:
    prepared, annotation, data, config = tiny
    augmented = with_qat(config, augment=QatAugment(flip=True, crop_padding=1))
    whole = qat(prepared, annotation, data, augmented)
    assert whole.epochs != qat(prepared, annotation, data, config).epochs  # the batches trained on differ
    path = tmp_path / "qat.checkpoint.pt"
    with pytest.raises(Canceled):  # before step 5 of 8: the checkpoint of step 3 stays
        qat(prepared, annotation, data, augmented, should_cancel=Polls(5), checkpointing=Checkpointing(path, path, "a"))
    polls = Polls()
    resumed = qat(
        prepared, annotation, data, augmented, should_cancel=polls, checkpointing=Checkpointing(path, path, "a")
    )
    # 5 steps trained after step 3; the augmentation's draws resumed too, or the epochs would differ
    assert polls.count == 5 and resumed.epochs == whole.epochs


def test_augmentation_is_refused_for_inputs_that_are_not_images() -> None:
    prepared, annotation, data, config = regression_setup()
    with pytest.raises(InvalidDataError, match=r"qat\.augment: input 'x' is float32 \[4\] per sample"):
        qat(prepared, annotation, data, with_qat(config, augment=QatAugment(flip=True)))


# ---- intermediate tensors ----


def test_intermediate_tensors_are_distilled_as_relative_squared_errors(tiny) -> None:
    prepared, annotation, data, config = tiny
    plain = qat(prepared, annotation, data, config)
    inner = qat(prepared, annotation, data, with_qat(config, intermediate=("r",)))
    assert inner.epochs != plain.epochs and inner.outputs == plain.outputs == {"logits": "scores"}
    rng = np.random.default_rng(0)
    y, t = (torch.from_numpy(rng.normal(size=(4, 3, 2, 2)).astype(np.float32)) for _ in range(2))
    # an intermediate tensor's term is mse / power whatever the loss (kl reads class outputs only)
    term = Distillation("kl", {"r": "intermediate"}, {"r": 2.0}).loss({"r": y}, {"r": t})
    assert float(term) == pytest.approx(float(((y - t) ** 2).mean() / 2.0), rel=1e-6)  # the same float32 ops


def test_unknown_intermediate_tensors_are_refused_by_name(tiny) -> None:
    prepared, annotation, data, config = tiny
    with pytest.raises(InvalidDataError, match=r"qat\.intermediate: no node of the model computes \['nope'\]"):
        qat(prepared, annotation, data, with_qat(config, intermediate=("r", "nope")))
