"""Stage qat: train the whole quantized graph by distillation from the FP32 model, then hand the trained
weights and scales to export.

1. Convert: the prepared graph with its calibrated annotation becomes a ``GraphModule``. A node no torch
   converter runs (``reconstruction.torch_ops.unsupported``: the op, or the attribute, at fault), or no
   float output to distill: the stage is skipped with the reason and the post-training model goes on
   unchanged. Inputs batched off axis 0 and constant inputs are held sample-major and put back in the
   model's layout for every forward (``quantcore.qat.layout``).
2. Data: the first ``num_samples`` calibration samples; the last ``holdout`` fraction is held out (whole
   batches where the model fixes its batch size). Targets: the FP32 model's outputs, and its
   ``intermediate`` tensors (ONNX Runtime), computed once; with ``augment``, the training batches are
   flipped and cropped (``quantcore.qat.augmentation``) and their targets computed again on each augmented
   batch, since a stored target belongs to the unaugmented sample. Labels (``label_weight``): the
   calibration samples' own, when given.
3. Train: Adam on the weights and biases (``lr``) and the log-scales (``scale_lr``), each step relative to
   what the parameter is measured against (a channel's size, a grid's step: ``GraphModule.relative_step``),
   ``epochs`` times
   ``steps`` batches of ``batch_size`` in a seeded order, loss ``quantcore.qat.distillation``. After every
   epoch the held-out SQNR is measured and reported; ``should_cancel`` is polled before every step. With
   ``checkpointing``, the loop's whole state is saved every ``checkpoint_every`` steps and a matching
   checkpoint is resumed from (``quantcore.qat.checkpoint``): a resumed run trains exactly as one that
   never stopped.
4. Keep: the parameters of the epoch with the best held-out SQNR, if it beats the post-training model's
   (epoch 0); otherwise the post-training model (``kept_ptq``). A non-finite loss ends training at once
   and keeps the post-training model (``diverged``, with the step).
5. Write back: weights as grid values, biases as trained, learned scales into the configs (activation
   scales shared along their dominator chains, ``reconstruction.reconstruct.set_scale``), so the QDQ
   exporter stores exactly what was trained.

Deterministic for a seed on one device: the batches and the augmentation are drawn from seeded
generators and nothing else is random.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import onnx
import torch

from quantcore.annotate.annotation import Annotation
from quantcore.config import QatConfig, QuantizeConfig
from quantcore.errors import InvalidDataError, UnsupportedModelError
from quantcore.graph.index import GraphIndex
from quantcore.prepare.preparation import PreparedModel
from quantcore.progress import CancelCheck, Monitor, ProgressCallback
from quantcore.qat import checkpoint
from quantcore.qat.augmentation import Augmentation, image_problem
from quantcore.qat.checkpoint import BatchOrder, Checkpointing, Position
from quantcore.qat.distillation import Distillation, label_output, output_kinds
from quantcore.qat.graph_module import GraphModule, graph_outputs
from quantcore.qat.layout import SampleLayout, sample_major
from quantcore.reconstruction.blocks import Block, whole_graph
from quantcore.reconstruction.reconstruct import calibration_samples, set_scale, with_weights
from quantcore.runtime.batching import Batches
from quantcore.runtime.device import torch_device
from quantcore.runtime.session import open_session
from quantcore.runtime.threads import torch_threads

STAGE = "qat"
EVAL_BATCH = 256  # samples per no-grad forward when measuring the held-out split


@dataclass(frozen=True)
class EpochReport:
    epoch: int
    steps: int
    loss: float  # mean training loss over the epoch's steps (distillation, plus the label term if any)
    heldout_sqnr_db: float  # after the epoch


@dataclass(frozen=True)
class QatResult:
    """``prepared`` / ``annotation``: the model to export (trained, or the input's when not kept).
    status: trained | kept_ptq (no epoch beat the post-training model on the held-out split) | skipped
    (nothing trained: ``reason``) | diverged (a non-finite loss stopped training: ``reason``)."""

    prepared: PreparedModel
    annotation: Annotation
    config: QatConfig
    device: str
    status: str
    reason: str | None = None
    num_train: int = 0
    num_heldout: int = 0
    outputs: dict[str, str] = field(default_factory=dict)  # output distilled → its kind
    before_sqnr_db: float | None = None  # held-out SQNR of the post-training model
    after_sqnr_db: float | None = None  # of the model kept
    best_epoch: int = 0  # 0: the post-training model
    epochs: tuple[EpochReport, ...] = ()
    resumed_from: int | None = None  # the step a checkpoint of an earlier attempt let training go on from
    seconds: float = 0.0

    @property
    def warnings(self) -> list[str]:
        return [f"qat {self.status}: {self.reason}"] if self.status in ("skipped", "diverged") else []

    def statement(self) -> str:
        if self.status in ("skipped", "diverged"):
            return f"{self.status}: {self.reason}"
        return (
            f"{self.status}: held-out SQNR {self.before_sqnr_db:.2f} → {self.after_sqnr_db:.2f} dB "
            f"after {len(self.epochs)} epochs (best {self.best_epoch})"
        )

    def summary(self) -> dict[str, Any]:
        def finite(value: float | None) -> float | None:
            return value if value is not None and math.isfinite(value) else None

        return {
            **self.config.to_dict(),
            "device": self.device,
            "status": self.status,
            "reason": self.reason,
            "num_train": self.num_train,
            "num_heldout": self.num_heldout,
            "outputs": self.outputs,
            "heldout_sqnr_db": {"before": finite(self.before_sqnr_db), "after": finite(self.after_sqnr_db)},
            "best_epoch": self.best_epoch,
            "curve": [{**asdict(e), "heldout_sqnr_db": finite(e.heldout_sqnr_db)} for e in self.epochs],
            "resumed_from": self.resumed_from,
            "seconds": self.seconds,
        }


def _split(count: int, qc: QatConfig, fixed_batch: int | None) -> tuple[int, int]:
    """(training, held-out) sample counts: the held-out part ``holdout`` of ``count``, at least one sample
    (one whole batch where the model fixes it). Raises InvalidDataError naming ``qat.batch_size`` when the
    training part cannot fill one batch."""
    unit = fixed_batch or 1
    heldout = max(1, round(count * qc.holdout / unit)) * unit
    train = count - heldout
    need = fixed_batch or qc.batch_size
    if train < need:
        raise InvalidDataError(
            f"qat.batch_size: {count} calibration samples leave {train} for training after holding out "
            f"{heldout}, fewer than one batch of {need}; give more samples or a smaller batch_size"
        )
    return train, heldout


class _Teacher:
    """The FP32 model in ONNX Runtime: ``run(feed)`` → {name: (B, ...)} for the graph outputs and the
    ``intermediate`` tensors, each with its samples along axis 0 (InvalidDataError naming
    ``qat.intermediate`` for one whose first axis is not the batch's)."""

    def __init__(
        self, session, prepared: PreparedModel, intermediate: tuple[str, ...], layout: SampleLayout | None = None
    ) -> None:
        self.session = session
        self.layout = layout
        self.names = [o.name for o in prepared.model.graph.output] + list(intermediate)
        self.intermediate = set(intermediate)

    def run(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        layout = self.layout
        fetched = self.session.run(self.names, feed if layout is None else layout.feed(feed))
        values = {n: np.asarray(v) for n, v in zip(self.names, fetched, strict=True)}
        values = values if layout is None else {n: layout.output(n, v) for n, v in values.items()}
        count = len(next(iter(feed.values())))
        for name in self.intermediate:
            if values[name].ndim == 0 or values[name].shape[0] != count:
                raise InvalidDataError(
                    f"qat.intermediate: tensor {name!r} has shape {list(values[name].shape)} for a batch of "
                    f"{count}; only tensors whose first axis is the batch can be distilled"
                )
        return values

    def targets(self, samples: Mapping[str, np.ndarray], count: int, batch: int) -> dict[str, np.ndarray]:
        """The teacher's values on every sample, {name: (count, ...)}."""
        parts: dict[str, list[np.ndarray]] = {name: [] for name in self.names}
        for start in range(0, count, batch):
            for name, value in self.run({n: v[start : start + batch] for n, v in samples.items()}).items():
                parts[name].append(value)
        return {name: np.concatenate(values) for name, values in parts.items()}


def _tensor(value: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(value)).to(device)


@dataclass(frozen=True)
class _Samples:
    """The samples, FP32 targets and labels in host memory (the first ``num_train`` train, the rest are held
    out), handed to the device batch by batch. With ``augmentation``, training batches are augmented and
    their targets are ``teacher``'s on the augmented batch."""

    inputs: Mapping[str, np.ndarray]
    targets: Mapping[str, np.ndarray]
    labels: np.ndarray | None  # (count,) int64 class ids, with a label loss
    num_train: int
    train_batch: int
    eval_batch: int
    device: torch.device
    augmentation: Augmentation | None = None
    teacher: _Teacher | None = None
    layout: SampleLayout | None = None  # where the model reads its samples; None: axis 0 of every input

    def batch(self, index: np.ndarray) -> dict[str, torch.Tensor]:
        return self._model_inputs({n: _tensor(v[index], self.device) for n, v in self.inputs.items()})

    def _model_inputs(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return tensors if self.layout is None else self.layout.tensors(tensors, self.device)

    def training(self, names, index: np.ndarray):
        """(inputs, targets of ``names``, labels or None) of the training batch ``index``, on the device."""
        labels = None if self.labels is None else _tensor(self.labels[index], self.device)
        if self.augmentation is None:
            targets = {n: _tensor(self.targets[n][index], self.device) for n in names}
            return self.batch(index), targets, labels
        inputs = self.augmentation.apply({n: v[index] for n, v in self.inputs.items()})
        targets = self.teacher.run(inputs)
        tensors = self._model_inputs({n: _tensor(v, self.device) for n, v in inputs.items()})
        return tensors, {n: _tensor(targets[n], self.device) for n in names}, labels

    @property
    def heldout(self) -> np.ndarray:
        return np.arange(self.num_train, len(next(iter(self.targets.values()))))


def _outputs(
    module: GraphModule, outputs: list[torch.Tensor], names, layout: SampleLayout | None
) -> dict[str, torch.Tensor]:
    """The module's ``outputs`` of ``names``, each with its samples on axis 0 as the targets hold them."""
    position = {name: i for i, name in enumerate(module.block.outputs)}
    values = {name: outputs[position[name]] for name in names}
    return values if layout is None else {name: layout.output(name, value) for name, value in values.items()}


def _heldout_sqnr(module: GraphModule, samples: _Samples, distillation: Distillation) -> float:
    module.eval()
    names, index = distillation.outputs, samples.heldout
    parts: dict[str, list[np.ndarray]] = {name: [] for name in names}
    with torch.no_grad():
        for start in range(0, len(index), samples.eval_batch):
            batch = samples.batch(index[start : start + samples.eval_batch])
            outputs = _outputs(module, module(batch), names, samples.layout)
            for name in names:
                parts[name].append(outputs[name].cpu().numpy())
    predicted = {name: np.concatenate(values) for name, values in parts.items()}
    return distillation.sqnr_db(predicted, {name: samples.targets[name][index] for name in names})


def _train(
    module: GraphModule,
    samples: _Samples,
    distillation: Distillation,
    qc: QatConfig,
    before: float,
    monitor: Monitor,
    checkpointing: Checkpointing | None,
) -> tuple[Position, str | None]:
    """Adam over ``qc.epochs`` epochs from the post-training model (held-out SQNR ``before``), or from a
    matching checkpoint's position: the final position (its best epoch and parameters) and None, or the
    position reached and why training diverged."""
    groups = [{"params": list(module.tensors.values()), "lr": qc.lr}]
    if module.scale_parameters():
        groups.append({"params": module.scale_parameters(), "lr": qc.scale_lr})
    optimizer = torch.optim.Adam(groups)
    order = BatchOrder(samples.num_train, samples.train_batch, qc.seed)
    steps = qc.steps or math.ceil(samples.num_train / samples.train_batch)
    names = list(distillation.kinds)
    augmentation = samples.augmentation
    at = checkpoint.restore(checkpointing, module, optimizer, order, augmentation) if checkpointing else None
    if at is not None:
        at.resumed_from = (at.epoch - 1) * steps + at.step
    at = at or Position(best=before)
    while at.epoch <= qc.epochs:
        module.train()
        while at.step < steps:
            monitor.check(STAGE)
            inputs, targets, labels = samples.training(names, order.next())
            loss = distillation.loss(_outputs(module, module(inputs), names, samples.layout), targets, labels)
            if not torch.isfinite(loss):
                return at, (
                    f"the loss became {float(loss.detach())} at epoch {at.epoch} step {at.step + 1}; "
                    "training stopped and the post-training model was kept"
                )
            optimizer.zero_grad()
            loss.backward()
            previous = module.state()
            optimizer.step()
            module.relative_step(previous)
            at.step, at.total = at.step + 1, at.total + float(loss.detach())
            if checkpointing is not None and ((at.epoch - 1) * steps + at.step) % qc.checkpoint_every == 0:
                checkpoint.save(checkpointing, at, module, optimizer, order, augmentation)
        metric = _heldout_sqnr(module, samples, distillation)
        at.epochs.append(asdict(EpochReport(at.epoch, steps, at.total / steps, metric)))
        message = f"epoch {at.epoch}/{qc.epochs}: loss {at.total / steps:.4g}, held-out SQNR {metric:.2f} dB"
        monitor.report(STAGE, at.epoch / qc.epochs, message)
        if metric > at.best:
            at.best, at.best_epoch, at.best_state = metric, at.epoch, module.state()
        at.epoch, at.step, at.total = at.epoch + 1, 0, 0.0
    return at, None


def check_qat_data(qc: QatConfig, model: onnx.ModelProto, labels: np.ndarray | None) -> None:
    """What ``qat`` checks before it trains, callable before any slow stage: InvalidDataError naming
    ``qat.label_weight`` for a label loss without ``labels``, or ``qat.intermediate`` for a name no node of
    the (prepared) ``model`` computes."""
    if qc.label_weight > 0 and labels is None:
        raise InvalidDataError(
            "qat.label_weight: a label loss needs labels for the calibration samples, and this data has none"
        )
    computed = {o for node in model.graph.node if node.op_type != "Constant" for o in node.output}
    unknown = [name for name in qc.intermediate if name not in computed]
    if unknown:
        raise InvalidDataError(
            f"qat.intermediate: no node of the model computes {unknown}; name tensors a node outputs, as Netron "
            "shows them (a BatchNormalization folded into its Conv leaves the Conv's output under the BN's name)"
        )


def _labels(qc: QatConfig, labels: np.ndarray | None, count: int) -> np.ndarray | None:
    """The (count,) int64 labels of the samples trained on with a label loss (None without one); raises
    InvalidDataError naming ``qat.label_weight`` unless they are one integer per sample."""
    if qc.label_weight == 0:
        return None
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.dtype.kind not in "iu" or len(labels) < count:
        raise InvalidDataError(
            f"qat.label_weight: labels must be one integer per calibration sample ({count}), got "
            f"{labels.dtype} {list(labels.shape)}"
        )
    return labels[:count].astype(np.int64)


def _check_label_output(kinds: Mapping[str, str], targets: Mapping[str, np.ndarray], labels: np.ndarray) -> None:
    """InvalidDataError naming ``qat.label_weight`` unless a (batch, classes) class output exists and every label
    indexes it."""
    name = label_output(kinds)
    if name is None:
        raise InvalidDataError(
            "qat.label_weight: a label loss needs a class output, (batch, classes) scores or a Softmax's "
            f"probabilities; the model's float outputs are {sorted(k for k, v in kinds.items() if v != 'intermediate')}"
        )
    if targets[name].ndim != 2:  # (B, T, C) probabilities of a sequence hold a class per position, not per sample
        raise InvalidDataError(
            f"qat.label_weight: a label loss reads one class per sample, from a (batch, classes) output; the "
            f"class output {name!r} has shape {list(targets[name].shape)}"
        )
    classes = targets[name].shape[-1]
    if labels.min() < 0 or labels.max() >= classes:
        raise InvalidDataError(
            f"qat.label_weight: labels range over {labels.min()}..{labels.max()}, but output {name!r} has "
            f"{classes} classes"
        )


def _with_intermediate(block: Block, intermediate: tuple[str, ...]) -> Block:
    """``block`` also returning the ``intermediate`` tensors (``check_qat_data``'s), after the graph outputs."""
    return replace(block, outputs=(*block.outputs, *(n for n in intermediate if n not in block.outputs)))


def qat(
    prepared: PreparedModel,
    annotation: Annotation,
    calibration: Mapping[str, np.ndarray] | Batches,
    config: QuantizeConfig,
    *,
    labels: np.ndarray | None = None,
    progress: ProgressCallback | None = None,
    should_cancel: CancelCheck | None = None,
    checkpointing: Checkpointing | None = None,
) -> QatResult:
    """Train a calibrated ``annotation`` of ``prepared`` per ``config.qat`` (module docstring).

    Returns new ``prepared``/``annotation`` objects (the inputs are not modified); export them as usual.
    ``labels``: the calibration samples' class ids (N,), read with ``config.qat.label_weight`` > 0.
    ``checkpointing``: where training is checkpointed every ``config.qat.checkpoint_every`` steps and
    resumed from (``quantcore.qat.checkpoint``); None: neither. Raises ValueError without ``config.qat``
    (or with device cuda where torch sees none), InvalidDataError naming the ``qat`` field when the samples
    cannot fill one training batch, a label loss has no labels or no class output to read, augmentation
    meets inputs that are not images, or an intermediate tensor is unknown; ``Canceled`` when
    ``should_cancel()`` turns True.
    """
    qc = config.qat
    if qc is None:
        raise ValueError("config.qat is None: nothing to train")
    device = torch_device(config.device)
    started = time.perf_counter()

    def ended(status: str, **fields: Any) -> QatResult:
        kept = {"prepared": prepared, "annotation": annotation, **fields}
        seconds = round(time.perf_counter() - started, 3)
        return QatResult(config=qc, device=device.type, status=status, seconds=seconds, **kept)

    check_qat_data(qc, prepared.model, labels)
    block = _with_intermediate(whole_graph(prepared.model.graph, annotation), qc.intermediate)
    if block.unsupported:
        return ended("skipped", reason=f"not convertible to torch: {'; '.join(block.unsupported)}")
    try:  # host arrays sample-major; the layout moves each input back to its own batch axis for a forward
        layout, source = sample_major(prepared.model, calibration, config.batch_size)
        inputs, count, batch, fixed = calibration_samples(
            source, prepared, qc.num_samples, config.batch_size, purpose="QAT"
        )
    except UnsupportedModelError as error:
        return ended("skipped", reason=str(error))
    train_labels = _labels(qc, labels, count)
    augmentation = None
    if qc.augment is not None and qc.augment.active:
        problem = image_problem(inputs)
        if problem is not None:
            raise InvalidDataError(f"qat.augment: {problem}")
        augmentation = Augmentation(qc.augment, qc.seed)
    num_train, num_heldout = _split(count, qc, batch if fixed else None)
    with contextlib.ExitStack() as teaching:
        session = teaching.enter_context(open_session(prepared.model, device=config.device, outputs=qc.intermediate))
        teacher: _Teacher | None = _Teacher(session, prepared, qc.intermediate, layout)
        targets = teacher.targets(inputs, count, batch)
        if augmentation is None:  # the stored targets serve every batch: the FP32 session goes before training
            teacher = session = None
            teaching.close()
        # float outputs with one row per sample (an output the batch does not run along cannot be matched)
        names = [
            n
            for n in graph_outputs(prepared.model, block)
            if targets[n].dtype.kind == "f" and targets[n].ndim > 0 and len(targets[n]) == count
        ]
        if not names:
            return ended("skipped", reason="the model has no float output to distill")
        kinds = {**output_kinds(prepared.model, names, targets), **dict.fromkeys(qc.intermediate, "intermediate")}
        if train_labels is not None:
            _check_label_output(kinds, targets, train_labels)
        power = {n: float(np.mean(targets[n][:num_train].astype(np.float64) ** 2)) for n in kinds}
        distillation = Distillation(qc.loss, kinds, power, qc.label_weight)
        # the model's own batch where it fixes one (a Reshape may hard-code it), else batch_size / EVAL_BATCH
        batches = (batch, batch) if fixed else (min(qc.batch_size, num_train), EVAL_BATCH)
        samples = _Samples(inputs, targets, train_labels, num_train, *batches, device, augmentation, teacher, layout)
        outputs = {n: kinds[n] for n in distillation.outputs}
        common = {"num_train": num_train, "num_heldout": num_heldout, "outputs": outputs}
        with torch_threads(qc.threads if device.type == "cpu" else 0):
            module = GraphModule(
                block, GraphIndex(prepared.model.graph), annotation, annotation.configs,
                learn_scales=qc.learn_scales, device=device,
            )  # fmt: skip
            before = _heldout_sqnr(module, samples, distillation)
            monitor = Monitor(progress, should_cancel)
            at, diverged = _train(module, samples, distillation, qc, before, monitor, checkpointing)
            if checkpointing is not None:
                checkpoint.remove(checkpointing)
            epochs = tuple(EpochReport(**e) for e in at.epochs)
            common["resumed_from"] = at.resumed_from
            if diverged is not None:
                return ended("diverged", reason=diverged, before_sqnr_db=before, epochs=epochs, **common)
            if at.best_state is None:
                return ended("kept_ptq", before_sqnr_db=before, after_sqnr_db=before, epochs=epochs, **common)
            module.load_state(at.best_state)
            values, weight_configs = module.trained()
            configs = {**annotation.configs, **weight_configs}
            for root, scale in module.learned_scales().items():
                set_scale(configs, root, scale)
    return ended(
        "trained",
        prepared=with_weights(prepared, values),
        annotation=annotation.with_configs(configs),
        before_sqnr_db=before,
        after_sqnr_db=at.best,
        best_epoch=at.best_epoch,
        epochs=epochs,
        **common,
    )
