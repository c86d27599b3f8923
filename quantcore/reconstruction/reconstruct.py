"""Stage 4, reconstruct: learn each weight's rounding (and, block-wise, the activation scales) so that
every block of the quantized model reproduces the FP32 model's output.

For each block of ``blocks.partition`` in graph order (AdaRound: layers; BRECQ/QDrop: blocks):

1. cache, for the first ``num_samples`` calibration samples, the block's inputs as the *quantized model
   so far* computes them (ONNX Runtime, exact Q/DQ arithmetic, the blocks before it already
   reconstructed), the FP32 model's inputs (QDrop) and the FP32 model's outputs (the target);
2. minimise, with Adam over ``iters`` steps of ``batch_size`` random samples,

       L = E_batch,positions ||f_q(x_q) - f(x)||²  +  λ · Σ_weights R(V)   (R from ``adaround``; λ = 0 in warm-up)

   where f_q is the block with learned rounding (and learned activation scales, dropped activation
   quantization for QDrop) and ||·||² sums over axis 1 (channels), averaged over batch and positions
   as in BRECQ's code (``_loss``). Where a block tensor does not hold its samples on axis 0 (a
   sequence-first transformer's (L, N, D)), a step is one ONNX Runtime run's samples instead, as the
   graph computed them (``cache``);
3. harden V to floor/ceil; if the block's loss on all cached samples is not below round-to-nearest's,
   keep round-to-nearest (reported as ``kept_nearest``);
4. commit: the weights become their grid values (q - o)·s in the returned model, the learned scales
   go into the returned annotation (dominator groups share them).

A block with an op ``torch_ops`` cannot run stays at round-to-nearest with a warning. Deterministic
for a seed (samples drawn and elements dropped from seeded generators; block k uses seed + k).
Progress: ``progress("reconstruct", fraction, "block i/n step j/iters")``; ``should_cancel`` is polled
every ``CANCEL_EVERY`` steps.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from quantcore.annotate.annotation import Annotation
from quantcore.calibrate.calibration import dominator_root
from quantcore.config import QuantizeConfig, ReconstructionConfig
from quantcore.errors import InvalidDataError, UnsupportedModelError
from quantcore.export.qdq import build_qdq_model
from quantcore.graph.index import GraphIndex
from quantcore.numerics.tqc import QuantState
from quantcore.prepare.preparation import PreparedModel
from quantcore.progress import CancelCheck, Monitor, ProgressCallback
from quantcore.reconstruction.adaround import beta_at
from quantcore.reconstruction.blocks import Block, partition
from quantcore.reconstruction.cache import BlockCache
from quantcore.reconstruction.converter import BlockModule, learnable_activation, learnable_weight
from quantcore.runtime.batching import Batches, input_specs
from quantcore.runtime.device import torch_device
from quantcore.runtime.session import open_session
from quantcore.runtime.threads import torch_threads

STAGE = "reconstruct"
CANCEL_EVERY = 10  # steps between should_cancel polls
REPORTS_PER_BLOCK = 20  # progress events per block at most
EVAL_BATCH = 256  # samples per no-grad forward when measuring a block's loss


@dataclass(frozen=True)
class BlockReport:
    name: str
    kind: str  # layer | layers | residual
    nodes: list[str]
    weights: list[str]
    status: str  # reconstructed | kept_nearest | unsupported | nothing_to_learn
    iters: int = 0
    loss_before: float | None = None  # round-to-nearest, calibrated scales, on all cached samples
    loss_after: float | None = None  # hardened rounding, learned scales
    seconds: float = 0.0
    cache: str | None = None  # memory | disk
    warning: str | None = None


@dataclass(frozen=True)
class ReconstructionResult:
    """``prepared``: the model with the learned weights (on their grids); ``annotation``: the configs
    with learned activation scales; ``blocks``: one report per block."""

    prepared: PreparedModel
    annotation: Annotation
    blocks: tuple[BlockReport, ...]
    config: ReconstructionConfig
    num_samples: int
    device: str

    @property
    def warnings(self) -> list[str]:
        return [b.warning for b in self.blocks if b.warning]

    def summary(self) -> dict[str, Any]:
        return {
            **self.config.to_dict(),
            "device": self.device,
            "num_samples": self.num_samples,
            "blocks": [asdict(b) for b in self.blocks],
        }


def calibration_samples(
    calibration: Mapping[str, np.ndarray] | Batches,
    prepared: PreparedModel,
    limit: int,
    batch: int,
    *,
    purpose: str = "reconstruction",
):
    """The first ``limit`` calibration samples as {input: (N, ...)} arrays of the model's dtypes, N, the
    ONNX Runtime batch size, and whether the model fixes it (N is then a multiple of it, and every torch
    forward uses exactly that many samples, since the graph may hard-code it in a Reshape). ``purpose``
    names the stage in the errors (UnsupportedModelError for inputs batched off axis 0, InvalidDataError
    for no whole batch)."""
    batches = (
        calibration
        if isinstance(calibration, Batches)
        else Batches(calibration, input_specs(prepared.model), batch, what="calibration")
    )
    elsewhere = {spec.name: spec.batch_axis for spec in batches.specs if spec.batch_axis != 0}
    if elsewhere:
        raise UnsupportedModelError(
            f"{purpose} needs every model input to hold its samples on axis 0; these do not "
            f"(input: batch axis, None = a constant input): {elsewhere}. Quantize without {purpose}."
        )
    parts: dict[str, list[np.ndarray]] = {}
    count = 0
    for item in batches:
        take = min(limit - count, len(next(iter(item.values()))))
        for name, value in item.items():
            parts.setdefault(name, []).append(np.array(value[:take]))
        count += take
        if count >= limit:
            break
    fixed = any(spec.fixed_batch is not None for spec in batches.specs)
    if fixed:
        count = count // batches.batch_size * batches.batch_size
    if count == 0:
        raise InvalidDataError(f"{purpose} needs at least one batch of calibration samples")
    arrays = {name: np.concatenate(values)[:count] for name, values in parts.items()}
    return arrays, count, batches.batch_size, fixed


def with_weights(prepared: PreparedModel, weights: Mapping[str, np.ndarray]) -> PreparedModel:
    model = onnx.ModelProto()
    model.CopyFrom(prepared.model)
    for initializer in model.graph.initializer:
        if initializer.name in weights:
            initializer.CopyFrom(numpy_helper.from_array(weights[initializer.name], initializer.name))
    return replace(prepared, model=model)


def _run(session, names: list[str], samples: Mapping[str, np.ndarray], start: int, end: int) -> dict:
    feed = {name: value[start:end] for name, value in samples.items()}
    fetched = [n for n in names if n not in feed]
    values = dict(zip(fetched, session.run(fetched, feed), strict=True)) if fetched else {}
    return {n: feed[n] if n in feed else values[n] for n in names}


def _fill_cache(block: Block, fp_session, qdq_model: onnx.ModelProto, samples, count, batch, budget, device, drop):
    """BlockCache with ``q:<input>``, ``fp:<input>`` (when dropping) and ``y:<output>`` for every sample, or
    for every whole run of ``batch`` samples where a block tensor does not hold its samples on axis 0
    (the first run decides; a last partial run is then left out unless it is the only one)."""
    fp_names = [*(block.inputs if drop else ()), *block.outputs]
    cache = None
    with open_session(qdq_model, device=device, exact_qdq=True, outputs=block.inputs) as qdq_session:
        for run, start in enumerate(range(0, count, batch)):
            end = min(count, start + batch)
            fp = _run(fp_session, fp_names, samples, start, end)
            quantized = _run(qdq_session, list(block.inputs), samples, start, end)
            values = {
                **{f"q:{n}": v for n, v in quantized.items()},
                **({f"fp:{n}": fp[n] for n in block.inputs} if drop else {}),
                **{f"y:{n}": fp[n] for n in block.outputs},
            }
            if cache is None:
                per_run = any(np.shape(v)[:1] != (end - start,) for v in values.values())
                units = max(count // batch, 1) if per_run else count
                unit = 0 if per_run else 1  # the axes of one unit: a run's whole tensor, or a sample's
                specs = {k: ((units, *np.shape(v)[unit:]), np.asarray(v).dtype) for k, v in values.items()}
                cache = BlockCache(specs, budget, per_run=per_run)
            if not cache.per_run:
                for key, value in values.items():
                    cache[key][start:end] = value
            elif run < cache.units:
                for key, value in values.items():
                    cache[key][run] = value
    return cache


def _tensors(cache: BlockCache, prefix: str, names, index: np.ndarray | int, device) -> dict[str, torch.Tensor]:
    return {n: torch.from_numpy(np.ascontiguousarray(cache[f"{prefix}:{n}"][index])).to(device) for n in names}


def _loss(outputs: list[torch.Tensor], targets: list[torch.Tensor]) -> torch.Tensor:
    """Σ over outputs of the squared error summed over axis 1 (channels of NCHW, features of (B, F)) and
    averaged over the batch and every other axis (positions): BRECQ's and QDrop's reconstruction loss
    (plain MSE, not BRECQ's Fisher-weighted variant). The normalisation matters: the rounding loss weight
    λ (``ReconstructionConfig.rounding_loss_weight``) is set against this scale; summing over positions
    too would weaken λ by the number of positions (64 at 8x8) and leave h(V) undecided when it is
    hardened."""
    total = outputs[0].new_zeros(())
    for o, t in zip(outputs, targets, strict=True):
        error = (o - t) ** 2
        total = total + (error.sum(1) if error.ndim > 1 else error).mean()
    return total


def _block_loss(module: BlockModule, cache: BlockCache, device, chunk: int) -> float:
    module.eval()
    total = 0.0
    with torch.no_grad():
        for index, units in cache.chunks(chunk):
            outputs = module(_tensors(cache, "q", module.block.inputs, index, device))
            targets = list(_tensors(cache, "y", module.block.outputs, index, device).values())
            total += float(_loss(outputs, targets)) * units
    return total / cache.units


def _train(module: BlockModule, cache: BlockCache, batch: int, rc: ReconstructionConfig, seed: int, device, tick):
    """Adam on V (``rc.rounding_lr``) and on the log-scales (activation_lr), ``rc.iters`` steps."""
    weight_optimizer = torch.optim.Adam([m.v for m in module.adaround.values()], lr=rc.rounding_lr)
    scale_parameters = list(module.log_scales.values())
    scale_optimizer = torch.optim.Adam(scale_parameters, lr=rc.activation_lr) if scale_parameters else None
    sampler = torch.Generator().manual_seed(seed)
    module.generator = torch.Generator(device=device).manual_seed(seed + 1)
    module.drop_prob = rc.effective_drop_prob
    drop = module.drop_prob > 0
    module.set_weight_mode("soft")
    module.train()
    for step in range(rc.iters):
        index = cache.draw(sampler, batch)
        inputs = _tensors(cache, "q", module.block.inputs, index, device)
        fp_inputs = _tensors(cache, "fp", module.block.inputs, index, device) if drop else None
        targets = list(_tensors(cache, "y", module.block.outputs, index, device).values())
        loss = _loss(module(inputs, fp_inputs), targets)
        beta = beta_at(step, rc.iters, warmup=rc.warmup, beta_start=rc.beta_start, beta_end=rc.beta_end)
        if beta is not None:
            loss = loss + rc.rounding_loss_weight * module.regularizer(beta)
        weight_optimizer.zero_grad()
        if scale_optimizer is not None:
            scale_optimizer.zero_grad()
        loss.backward()
        weight_optimizer.step()
        if scale_optimizer is not None:
            scale_optimizer.step()
        tick(step + 1)
    module.set_weight_mode("hard")


class _Run:
    """The state one reconstruction carries from block to block: current weights and configs, which
    weights and scales earlier blocks own, the samples and the FP32 session. ``device``: the run's
    ``QuantizeConfig.device``, which names the block caches' ONNX Runtime sessions' device as it does the FP32
    session's, and resolves to the torch device blocks train on."""

    def __init__(self, prepared, annotation, rc, samples, count, batch, fixed, device, monitor, fp_session) -> None:
        self.prepared, self.annotation, self.rc = prepared, annotation, rc
        self.samples, self.count, self.batch = samples, count, batch
        self.session_device, self.device = device, torch_device(device)
        self.monitor, self.fp_session = monitor, fp_session
        self.index = GraphIndex(prepared.model.graph)
        self.configs = dict(annotation.configs)
        self.weights = {name: self.index.array(name).astype(np.float32) for name in annotation.parameters}
        self.changed: dict[str, np.ndarray] = {}  # learned weights, as grid values
        self.done: set[str] = set()  # weights learned (or left) by an earlier block
        self.scaled: set[str] = set()  # dominator roots whose scale an earlier block owned
        # samples per torch forward: the model's own batch when it fixes one
        self.train_batch, self.eval_batch = (batch, batch) if fixed else (rc.batch_size, EVAL_BATCH)

    def block(self, k: int, total: int, block: Block) -> BlockReport:
        rc = self.rc
        base = {"name": block.name, "kind": block.kind, "nodes": block.node_names, "weights": list(block.weights)}
        learn = {w for w in block.weights if w not in self.done and learnable_weight(self.configs[w])}
        if block.unsupported:
            self.done |= set(block.weights)
            warning = f"block {block.name!r} kept at round-to-nearest: {'; '.join(block.unsupported)}"
            return BlockReport(**base, status="unsupported", warning=warning)
        if not learn:
            return BlockReport(**base, status="nothing_to_learn")
        started = time.perf_counter()
        qdq_model = build_qdq_model(
            with_weights(self.prepared, self.changed), self.annotation.with_configs(self.configs)
        )
        drop = rc.effective_drop_prob > 0
        cache = _fill_cache(
            block, self.fp_session, qdq_model, self.samples, self.count, self.batch, rc.cache_bytes,
            self.session_device, drop,
        )  # fmt: skip
        roots = {dominator_root(t, self.configs) for t in _read_activations(block, self.annotation)}
        learned = {r for r in roots - self.scaled if learnable_activation(self.configs[r])}
        module = BlockModule(
            block,
            self.index,
            self.annotation,
            self.configs,
            self.weights,
            learn=learn,
            learned=learned if rc.learns_activation_scales else set(),
            device=self.device,
        )
        every = max(1, rc.iters // REPORTS_PER_BLOCK)

        def tick(step: int) -> None:
            if step % CANCEL_EVERY == 0:
                self.monitor.check(STAGE)
            if step % every == 0:
                message = f"block {k + 1}/{total} step {step}/{rc.iters}"
                self.monitor.report(STAGE, (k + step / rc.iters) / total, message)

        try:
            before = _block_loss(module, cache, self.device, self.eval_batch)
            _train(module, cache, self.train_batch, rc, rc.seed + k, self.device, tick)
            after = _block_loss(module, cache, self.device, self.eval_batch)
        finally:
            cache.close()
        improved = after < before
        if improved:
            self.changed.update(module.weight_values())
            self.weights.update(module.weight_values())
            for root, scale in module.learned_scales().items():
                set_scale(self.configs, root, scale)
        self.done |= learn
        self.scaled |= roots
        return BlockReport(
            **base,
            status="reconstructed" if improved else "kept_nearest",
            iters=rc.iters,
            loss_before=before,
            loss_after=after,
            seconds=round(time.perf_counter() - started, 3),
            cache=cache.kind,
        )


def reconstruct(
    prepared: PreparedModel,
    annotation: Annotation,
    calibration: Mapping[str, np.ndarray] | Batches,
    config: QuantizeConfig,
    *,
    progress: ProgressCallback | None = None,
    should_cancel: CancelCheck | None = None,
) -> ReconstructionResult:
    """Learned rounding per ``config.reconstruction`` for a calibrated ``annotation`` (module docstring).

    Returns new ``prepared``/``annotation`` objects (the inputs are not modified); export them as usual.
    Raises ValueError without ``config.reconstruction``, ``Canceled`` when ``should_cancel()`` turns True.
    """
    rc = config.reconstruction
    if rc is None:
        raise ValueError("config.reconstruction is None: nothing to reconstruct")
    device = torch_device(config.device)
    monitor = Monitor(progress, should_cancel)
    samples, count, batch, fixed = calibration_samples(calibration, prepared, rc.num_samples, config.batch_size)
    blocks = partition(prepared.model.graph, annotation, blockwise=rc.blockwise)
    graph_inputs = set(GraphIndex(prepared.model.graph).graph_inputs)
    boundary = list(dict.fromkeys(n for b in blocks for n in (*b.inputs, *b.outputs) if n not in graph_inputs))
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch_threads(rc.threads if device.type == "cpu" else 0))
        fp_session = stack.enter_context(open_session(prepared.model, device=config.device, outputs=boundary))
        run = _Run(prepared, annotation, rc, samples, count, batch, fixed, config.device, monitor, fp_session)
        reports = []
        for k, block in enumerate(blocks):
            monitor.check(STAGE)
            reports.append(run.block(k, len(blocks), block))
    return ReconstructionResult(
        prepared=with_weights(prepared, run.changed),
        annotation=annotation.with_configs(run.configs),
        blocks=tuple(reports),
        config=rc,
        num_samples=count,
        device=device.type,
    )


def _read_activations(block: Block, annotation: Annotation) -> list[str]:
    names = {node.name for node in block.nodes}
    return [t for t in annotation.activations if any(use.node in names for use in annotation.consumers[t])]


def set_scale(configs: dict, root: str, scale: np.ndarray) -> None:
    """Give ``root`` and every tensor sharing its scale (dominator chain) the learned ``scale``."""
    members = [name for name in configs if dominator_root(name, configs) == root]
    for name in members:
        tqc = configs[name]
        state = QuantState.ACTIVATED if name == root else QuantState.PASSIVE
        configs[name] = tqc.with_scale(scale.reshape(np.shape(tqc.scale)), tqc.offset, state=state)
