"""SmoothQuant (Xiao et al. 2023, "SmoothQuant: Accurate and Efficient Post-Training Quantization for Large
Language Models", section 4): move the outlier channels of a layer's activation into its weight, where
per-channel weight quantization absorbs them, so that the per-tensor activation grid serves the other
channels.

A group (``quantcore.graph.channel_scaling``) is the layers that read one float activation X through a
float32 weight W of their own: MatMul/Gemm nodes, whose channels are X's last axis (the axis the product
reduces over), or Conv nodes, whose channels are X's axis 1. For each channel j:

    m_j = max |X_j|                           over the calibration samples (streamed, one batch at a time)
    r_j = max over the group of max |W_j|     (W_j: the weights that multiply channel j)
    s_j = m_j^alpha / r_j^(1-alpha)           (s_j = 1 where m_j = 0 or r_j = 0: nothing to move)
    W_j ← s_j · W_j  for every W of the group,  X_j ← X_j / s_j

A group whose largest m_j is under its outlier ratio times its median has no outlier to move and keeps
its graph: ``OUTLIER_RATIO`` where a Mul is inserted, ``ABSORBED_OUTLIER_RATIO`` where the division is
absorbed and costs nothing at run time. X ÷ s is absorbed exactly into X's producer (a
LayerNormalization, a Mul or Add of a constant, a MatMul/Gemm or Conv with a constant weight) where X is
read by the group alone; else a MatMul/Gemm group gets a Mul by the constant 1/s inserted before it
(``quantcore.graph.channel_scaling``), and a Conv group is not formed. ONNX Runtime runs such a Mul as
its own Mul before the QuantizeLinear (float: the onnxruntime platform keeps a Mul by a constant spread
over more than 2x float, ``annotate/platforms/onnxruntime.py``; no QDQ fusion absorbs it). TensorRT
builds it as a pointwise layer, which its builder may fuse with the neighbouring element-wise layers
(its fusion catalog); not measured on a GPU here.

Convolutions: a CNN's activations carry outlier channels as a transformer's do (PP-OCRv4's recognizer:
feature maps whose largest channel spans 7-10x their median after a per-tensor affine step or a Conv
with no activation after it), and per-channel weight quantization absorbs s on a Conv's output channels
exactly as on a MatMul's columns. In a depthwise Conv channel j meets its own filter only, so s costs
its weights nothing.

alpha is chosen per model from ``ALPHAS`` on calibration samples split in two: the last ``SCORED_FRACTION``
(at most ``SEARCH_SAMPLES``) are held out, and each candidate is smoothed with the m of the rest, annotated,
calibrated on the first ``SEARCH_SAMPLES`` of the rest, exported as exact Q/DQ and scored on the held-out
samples (the worst float output's SQNR against FP32). An alpha counts only when it beats the unsmoothed
model beyond the 95 % paired bootstrap interval of their difference over the scored samples
(``quantcore.numerics.paired_scores``); the best-scored of those is kept, and smoothed again with the m of
every sample. When none does, the graph is kept as it was. Scored on the samples it was calibrated on, an
alpha could win by fitting the ranges to those samples alone; and a few samples can carry most of a model's
noise, so that the alphas' scores on 32 of them differ by more than their effect (PP-OCR's direction
classifier, every absorbed group smoothed on the onnxruntime platform: 15.1 to 22.4 dB across alphas against
19.2 dB unsmoothed on 32 held-out samples, while on 64 other samples the alpha that scored best lost 5.1
dB). Where the data is too small to hold ``MIN_HELD_OUT`` samples out of both parts, the first
``SEARCH_SAMPLES`` are calibrated on and scored on. Every s comes from the original weights and statistics,
so the groups' rescalings commute. The smoothed FP32 model computes the same function, to the float32
rounding of the rescaled constants.
Cost: one FP32 pass over the calibration data for m, one over the scored samples for the reference, and per
candidate (alpha and the unsmoothed model) one calibration on ``SEARCH_SAMPLES`` samples and one exact Q/DQ
run of the scored ones.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
import onnx

from quantcore.annotate.annotation import annotate
from quantcore.calibrate.calibration import calibrate
from quantcore.config import QuantizeConfig
from quantcore.export.qdq import build_qdq_model
from quantcore.graph.channel_scaling import Group, attributes, find_groups, scale_channels
from quantcore.graph.index import GraphIndex
from quantcore.numerics.paired_scores import Difference, SampleSums, SumsBuilder, difference
from quantcore.prepare.preparation import PreparedModel
from quantcore.progress import Monitor
from quantcore.runtime.batching import EXPOSED_BYTES_PER_BATCH, Batches, output_batch_axes
from quantcore.runtime.session import open_session
from quantcore.wording import counted

STAGE = "prepare"
ALPHAS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
# max_j m_j / median_j m_j from which a group is smoothed: below it, per-tensor quantization of X loses
# under 3 bits to its largest channel, and an inserted Mul would cost time for little
OUTLIER_RATIO = 8.0
# the same where X ÷ s is absorbed into X's producer: nothing to pay at run time, so from 2 bits on
ABSORBED_OUTLIER_RATIO = 4.0
SEARCH_SAMPLES = 32  # calibrated on by each candidate, and scored on, at most
SCORED_FRACTION = 0.5  # of the calibration samples, held out of the candidates' calibration to score them on
MIN_HELD_OUT = 8  # samples in either part, or none is held out (one sample moves an SQNR a lot)


@dataclass(frozen=True)
class Smoothing:
    """What ``smooth`` did: the groups smoothed (none when the unsmoothed model was kept), the alpha kept
    (None: none), every candidate's worst output SQNR in dB (key None: the unsmoothed model) on ``samples``
    calibration samples (``held_out``: ones the candidates were not calibrated on), the best alpha's gain
    over the unsmoothed model with its paired interval (None: no alpha was scored), and each outlier group's
    ratio max m / median m."""

    groups: tuple[Group, ...]
    alpha: float | None
    scores: dict[float | None, float]
    samples: int
    held_out: bool
    gain: Difference | None
    ratios: dict[str, float]

    def summary(self) -> dict[str, Any]:
        """JSON-ready, the report's ``prepare.smoothquant``: each candidate's score (key "unsmoothed", or the
        alpha), the samples scored and whether held out, the kept (else best) alpha's gain and interval, every
        outlier group's ratio, and the groups smoothed with how X ÷ s was applied."""
        return {
            "alpha": self.alpha,
            "scores_db": {"unsmoothed" if a is None else f"{a:g}": v for a, v in self.scores.items()},
            "scored_on_samples": self.samples,
            "held_out": self.held_out,
            "best_alpha_gain_db": None if self.gain is None else self.gain.to_dict(),
            "outlier_ratios": self.ratios,
            "smoothed": [
                {
                    "input": g.input,
                    "layers": list(g.layers),
                    "division": "Mul inserted" if g.absorbed is None else "absorbed into its producer",
                }
                for g in self.groups
            ],
        }

    def statement(self) -> str:
        if not self.ratios:
            return "smoothquant: no layer with outlier channels"
        scored = f"{self.samples} {'held-out ' if self.held_out else ''}calibration samples"
        if self.alpha is None:
            best = max((a for a in self.scores if a is not None), key=self.scores.__getitem__)
            return (
                f"smoothquant: {counted(len(self.ratios), 'outlier group')}, none smoothed (the best, alpha = "
                f"{best:g}, {self._gain()} over the unsmoothed model on {scored}: not beyond noise)"
            )
        layers = sum(len(g.layers) for g in self.groups)
        inserted = sum(g.absorbed is None for g in self.groups)
        smoothed = f"{counted(layers, 'layer')} smoothed in {counted(len(self.groups), 'group')}"
        return (
            f"smoothquant: {smoothed}, alpha = {self.alpha:g} ({self.scores[self.alpha]:.1f} dB vs "
            f"{self.scores[None]:.1f} dB unsmoothed, {self._gain()}, on {scored}; {inserted} Mul inserted)"
        )

    def _gain(self) -> str:
        gain = self.gain
        return "" if gain is None else f"{gain.value:+.1f} dB [{gain.low:+.1f}, {gain.high:+.1f}]"


def _weight_rows(node: onnx.NodeProto, weight: np.ndarray) -> np.ndarray:
    """(K,) max |W_j| over the weights that multiply channel j of the data operand."""
    if node.op_type == "Gemm" and attributes(node).get("transB", 0):
        return np.abs(weight).max(axis=0)  # B is (N, K)
    if node.op_type == "Conv":  # (O, C/g, k...): channel j meets column j mod C/g of its group's filters
        groups = attributes(node).get("group", 1)
        columns = np.abs(weight).reshape(weight.shape[0], weight.shape[1], -1).max(axis=2)  # (O, C/g)
        return columns.reshape(groups, -1, weight.shape[1]).max(axis=1).reshape(-1)
    return np.abs(np.moveaxis(weight, -2, 0)).reshape(weight.shape[-2], -1).max(axis=1)  # (..., K, N)


def channel_maxima(
    prepared: PreparedModel, groups: list[Group], batches: Batches, config: QuantizeConfig, monitor: Monitor
) -> dict[str, np.ndarray]:
    """group input → (C,) max |X_j| along the group's axis over ``batches``, each batch reduced as soon as
    it is run (ONNX Runtime returns the exposed tensors of one batch at a time; batches whose exposed
    tensors would pass ``EXPOSED_BYTES_PER_BATCH`` are split, as calibration's are). Checks for
    cancellation before each batch."""
    axes = {group.input: group.axis for group in groups}
    graph_inputs = set(GraphIndex(prepared.model.graph).graph_inputs)
    fetched = [name for name in axes if name not in graph_inputs]
    maxima: dict[str, np.ndarray] = {}
    with open_session(prepared.model, device=config.device, outputs=fetched) as session:
        if fetched:
            exposed, samples = batches.probe(lambda batch: sum(a.nbytes for a in session.run(fetched, batch)))
            batches = batches.within(exposed // samples, EXPOSED_BYTES_PER_BATCH)
        for batch in batches:
            monitor.check(STAGE)
            values = dict(zip(fetched, session.run(fetched, dict(batch)), strict=True)) if fetched else {}
            values.update((name, batch[name]) for name in axes if name in graph_inputs)
            for name, axis in axes.items():
                x = values[name]
                others = tuple(i for i in range(x.ndim) if i != axis % x.ndim)
                per_channel = np.abs(x).max(axis=others).astype(np.float64)
                maxima[name] = np.maximum(maxima[name], per_channel) if name in maxima else per_channel
            del values
    return maxima


def smoothing_scales(index: GraphIndex, group: Group, maxima: np.ndarray, alpha: float) -> np.ndarray:
    """(C,) s_j = m_j^alpha / r_j^(1-alpha) of ``group`` (module docstring), 1 where m_j or r_j is 0."""
    nodes = {node.name: node for node in index.graph.node}
    rows = np.max([_weight_rows(nodes[n], index.array(nodes[n].input[1])) for n in group.layers], axis=0)
    scale = np.ones_like(maxima)
    live = (maxima > 0) & (rows > 0)
    scale[live] = maxima[live] ** alpha / rows[live] ** (1.0 - alpha)
    return scale


def apply_smoothing(
    prepared: PreparedModel, groups: list[Group], maxima: Mapping[str, np.ndarray], alpha: float
) -> PreparedModel:
    """``prepared`` with ``groups`` smoothed at ``alpha`` (module docstring), in a copy of its model."""
    index = GraphIndex(prepared.model.graph)
    scales = {group.input: smoothing_scales(index, group, maxima[group.input], alpha) for group in groups}
    return replace(prepared, model=scale_channels(prepared.model, groups, scales))


def _quantized_sums(
    prepared: PreparedModel,
    fit: Batches,
    scored: Batches,
    reference: list[list[np.ndarray]],
    config: QuantizeConfig,
) -> SampleSums:
    """Per-sample SQNR sums of ``prepared`` annotated, calibrated on ``fit`` and run as exact Q/DQ on
    ``scored``, against ``reference`` (FP32's outputs of the same batches)."""
    calibrated = calibrate(prepared, annotate(prepared, config), fit, config)
    outputs = [o.name for o in prepared.model.graph.output]
    axes = output_batch_axes(prepared.model)
    builder = SumsBuilder("sqnr")
    start = 0
    with open_session(build_qdq_model(prepared, calibrated), device=config.device, exact_qdq=True) as session:
        for batch, expected in zip(scored, reference, strict=True):
            count = min(scored.batch_size, scored.num_samples - start)
            for name, x, y in zip(outputs, expected, session.run(outputs, batch), strict=True):
                builder.add(name, x, y, axes[name], count)
            start += count
    return builder.result()


def _score(sums: SampleSums) -> float:
    """The worst float output's SQNR (dB) over every scored sample; -inf where an output was not finite."""
    score = float(sums.scores(np.arange(sums.samples)))
    return -math.inf if math.isnan(score) else score


def kept_alpha(sums: Mapping[float | None, SampleSums]) -> tuple[float | None, Difference]:
    """(the alpha kept, None for the unsmoothed model; its gain over the unsmoothed model) from every
    candidate's per-sample sums (key None: the unsmoothed model): the best-scored of the alphas whose gain's
    paired interval lies above 0 (module docstring). None kept: the gain is the best-scored alpha's."""
    gains = {alpha: difference(sums[alpha], sums[None], higher_is_better=True) for alpha in sums if alpha is not None}
    beyond = [alpha for alpha, gain in gains.items() if gain.beyond]
    best = max(beyond or gains, key=lambda alpha: _score(sums[alpha]))
    return (best if beyond else None), gains[best]


def _threshold(group: Group) -> float:
    """The outlier ratio from which ``group`` is smoothed (module docstring)."""
    return OUTLIER_RATIO if group.absorbed is None else ABSORBED_OUTLIER_RATIO


def smooth(
    prepared: PreparedModel, batches: Batches, config: QuantizeConfig, monitor: Monitor | None = None
) -> tuple[PreparedModel, Smoothing]:
    """``prepared`` with its outlier groups smoothed at the alpha that quantizes best (module docstring), or
    ``prepared`` itself when no group has outliers or no alpha beats the unsmoothed model. ``batches``: the
    calibration data for the prepared model. Reports progress per candidate, checks for cancellation."""
    monitor = monitor or Monitor()
    groups = find_groups(prepared.model.graph, convolutions=True)
    if not groups:
        return prepared, Smoothing((), None, {}, 0, False, None, {})
    split = batches.held_out(SCORED_FRACTION, SEARCH_SAMPLES, MIN_HELD_OUT)
    fit, scored = split if split is not None else (batches, batches.first(SEARCH_SAMPLES))
    fit_maxima = channel_maxima(prepared, groups, fit, config, monitor)
    maxima = fit_maxima
    if split is not None:
        held_maxima = channel_maxima(prepared, groups, scored, config, monitor)
        maxima = {name: np.maximum(m, held_maxima[name]) for name, m in fit_maxima.items()}
    ratios = {}
    for group in groups:
        median = float(np.median(maxima[group.input]))
        ratios[group.input] = float(np.max(maxima[group.input])) / median if median > 0 else float("inf")
    groups = [g for g in groups if ratios[g.input] >= _threshold(g)]
    ratios = {g.input: ratios[g.input] for g in groups}
    if not groups:
        return prepared, Smoothing((), None, {}, 0, False, None, {})

    outputs = [o.name for o in prepared.model.graph.output]
    with open_session(prepared.model, device=config.device) as session:
        reference = [session.run(outputs, batch) for batch in scored]
    candidates: dict[float | None, PreparedModel] = {None: prepared}
    candidates.update((alpha, apply_smoothing(prepared, groups, fit_maxima, alpha)) for alpha in ALPHAS)
    sums: dict[float | None, SampleSums] = {}
    for i, (alpha, candidate) in enumerate(candidates.items()):
        monitor.check(STAGE)
        sums[alpha] = _quantized_sums(candidate, fit.first(SEARCH_SAMPLES), scored, reference, config)
        label = "unsmoothed" if alpha is None else f"smoothquant alpha = {alpha:g}"
        monitor.report(STAGE, (i + 1) / len(candidates), f"{label}: {_score(sums[alpha]):.1f} dB")
    scores = {alpha: _score(s) for alpha, s in sums.items()}
    best, gain = kept_alpha(sums)
    outcome = partial(Smoothing, scores=scores, samples=scored.num_samples, held_out=split is not None, gain=gain)
    if best is None:
        return prepared, outcome(groups=(), alpha=None, ratios=ratios)
    smoothed = apply_smoothing(prepared, groups, maxima, best) if split is not None else candidates[best]
    return smoothed, outcome(groups=tuple(groups), alpha=best, ratios=ratios)
