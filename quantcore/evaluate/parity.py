"""Deployed accuracy equals reported accuracy: compare the exported model run as exact Q/DQ
arithmetic with the same model run as deployed (ONNX Runtime's integer kernels), and say what to
change when they disagree.

They agree when, on the evaluation data, |top1(exact) - top1(deployed)| ≤ MAX_TOP1_GAP (when labels
were given) and either of these holds for every output:

    SQNR(exact → deployed) ≥ min(MIN_SQNR_DB, SQNR(FP32 → exact) + QUANTIZATION_MARGIN_DB)
    SQNR(FP32 → deployed) ≥ SQNR(FP32 → exact) - MAX_SQNR_LOSS_DB

with SQNR(a → b) = 10 · log10(Σ a² / Σ (a - b)²). The first: the deployment's own error (requantization
rounding, accumulation order) stays at most a quarter of the quantization error's power (6 dB below
it), and 30 dB suffices whatever the precision (int8 costs ~37 dB on the digits model). The second:
the deployed model is as accurate as the exact one, whatever their distance. Integer kernels that
round a requantized value to the other neighbouring code than exact Q/DQ does move it no further from
FP32, but such flips add up over a deep model: ddddocr's captcha reader (21 Conv, Swish, an LSTM) on one
sample was 28.2 dB from exact at an exact SQNR above 24 dB, while on 64 samples exact and deployed
were 21.6 and 21.7 dB from FP32 (30.7 dB apart). A fault (saturation, a rewrite that changes the
meaning) adds error of its own and fails both. 0.5 points of top-1 is the issue's accuracy budget.

Known causes and remedies:

- ``remedy``: on x86 CPUs without VNNI the u8s8 kernels saturate their 16-bit intermediate with
  full-range int8 weights (``quantcore.runtime.cpu_features``), so full-range weights go to the u8u8
  kernels as uint8, and 7-bit ones (``reduce_range`` ``auto`` there) stay on the u8s8 kernels. Where the
  full-range model disagrees, the onnxruntime platforms re-export with 7-bit weights
  (``reduce_range="on"``); a model already on 7-bit weights would be re-exported the same, and on a CPU
  whose kernels do not saturate 7-bit weights would cost accuracy and fix nothing, so neither is tried.
  On other platforms (tensorrt: int8 activations and weights,
  whose integer kernels saturate the same way there) ``isolate_optimizer`` finds
  ``QDQSelectorActionTransformer``, the rewrite that puts the integer kernels in, and the report
  names the cause.
- ``isolate_optimizer``: a graph rewrite of the installed ONNX Runtime that changes the model's
  meaning. ONNX Runtime 1.32's ``ReluQuantRewrite`` removes a Relu before a float8 QuantizeLinear as if
  the float8 grid started at zero like uint8's (it is signed: negative values survive, digits FP8 top-1
  0.344 instead of 0.994). The suspects in ``SUSPECT_OPTIMIZERS`` are disabled one at a time in the
  deployed session; the first whose absence restores agreement is named, and the deployed numbers are
  those of a session without it (``QuantizeConfig.disabled_optimizers``), which is also how users must
  run the model in that ONNX Runtime. ONNX Runtime 1.32's ``WeightBiasQuantization`` replaces the float
  bias of a Conv/Gemm reading dequantized inputs by int32 codes of step s_x·s_w; with 4-bit scales
  that step is coarse (a MobileNetV2-style digits model at academic W4A4: 16.9 dB from exact Q/DQ),
  though on that model, trained and run on an AMD EPYC, not less accurate (15.2 dB from FP32 against
  exact's 14.7, top-1 98.8 against 98.6 %), so parity keeps it there; trained and run on an Intel Xeon,
  its top-1 moved 0.6 points from exact's, and parity leaves the rewrite out.
- ``isolate_build_failure``: a graph rewrite that cannot handle the model at all, so that ONNX Runtime
  refuses to build it at full optimization. ONNX Runtime 1.32's ``ClipQuantRewrite`` raises on a
  Clip (ReLU6) before a QuantizeLinear with an int4/uint4 zero point. The suspects are disabled one at
  a time until the session builds; the first that lets it is named, and kept out of the deployed
  session from then on.

Other disagreements are reported, not hidden.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import onnxruntime as ort

from quantcore.annotate.platforms import PLATFORMS
from quantcore.config import QuantizeConfig
from quantcore.errors import QuantcoreError
from quantcore.runtime.cpu_features import this_cpu_saturates_u8s8, weight_range
from quantcore.runtime.session import open_session
from quantcore.wording import counted

MIN_SQNR_DB = 30.0
QUANTIZATION_MARGIN_DB = 6.0
MAX_TOP1_GAP = 0.005
MAX_SQNR_LOSS_DB = 0.5
INTEGER_KERNEL_REWRITE = "QDQSelectorActionTransformer"  # DQ → op → Q groups into integer kernels
# ONNX Runtime graph rewrites that move, fuse or drop Q/DQ and the ops beside them, most suspect first:
# the names ``InferenceSession(disabled_optimizers=...)`` takes (rewrite rules and transformers).
SUSPECT_OPTIMIZERS = (
    "ReluQuantRewrite",
    "ClipQuantRewrite",
    "WeightBiasQuantization",
    "QDQPropagationTransformer",
    "DoubleQDQPairsRemover",
    INTEGER_KERNEL_REWRITE,
    "QDQFinalCleanupTransformer",
    "ConvActivationFusion",
    "NchwcTransformer",
    "NhwcTransformer",
)


@dataclass(frozen=True)
class ParityVerdict:
    """Whether exact and deployed agree, the measured numbers and, if not, why."""

    agree: bool | None  # None: the deployed mode could not be measured
    min_sqnr_db: float | None  # worst output's SQNR of deployed against exact (None: identical)
    top1_gap: float | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "agree": self.agree,
            "min_sqnr_db": self.min_sqnr_db,
            "top1_gap": self.top1_gap,
            "tolerance": {
                "min_sqnr_db": MIN_SQNR_DB,
                "quantization_margin_db": QUANTIZATION_MARGIN_DB,
                "max_sqnr_loss_db": MAX_SQNR_LOSS_DB,
                "max_top1_gap": MAX_TOP1_GAP,
            },
            "reason": self.reason,
        }


def check_parity(evaluation: dict[str, Any]) -> ParityVerdict:
    """The verdict for an ``evaluate`` report (its ``deployed_vs_exact`` and top-1 entries)."""
    deployed = evaluation.get("qdq_deployed", {})
    if deployed.get("skipped"):
        return ParityVerdict(None, None, None, f"deployed mode not measured: {deployed['skipped']}")
    outputs = evaluation.get("deployed_vs_exact", {})
    if any(o.get("nonfinite") for o in outputs.values()):
        return ParityVerdict(False, None, None, "the deployed model produced NaN/inf where exact Q/DQ did not")
    values = [o["sqnr_db"] for o in outputs.values() if o.get("sqnr_db") is not None]
    worst = min(values) if values else None  # None: deployed equals exact bit for bit
    exact_top1, deployed_top1 = evaluation["qdq_exact"].get("top1"), deployed.get("top1")
    gap = abs(exact_top1 - deployed_top1) if exact_top1 is not None and deployed_top1 is not None else None
    exact_sqnr = [o["sqnr_db"] for o in evaluation["qdq_exact"]["outputs"].values() if o.get("sqnr_db") is not None]
    needed = min([MIN_SQNR_DB, *(s + QUANTIZATION_MARGIN_DB for s in exact_sqnr)])
    apart = worst is not None and worst < needed
    problems = []
    if apart and not _as_accurate(evaluation):
        problems.append(f"deployed vs exact SQNR {worst:.1f} dB < {needed:.1f} dB")
    if gap is not None and gap > MAX_TOP1_GAP:
        problems.append(f"top-1 differs by {100 * gap:.2f} points > {100 * MAX_TOP1_GAP:.1f}")
    if problems:
        return ParityVerdict(False, worst, gap, "; ".join(problems))
    kernels = deployed.get("integer_kernels")
    what = "the deployed model" if kernels is None else f"the deployed model ({counted(kernels, 'integer kernel')})"
    if apart:
        return ParityVerdict(
            True,
            worst,
            gap,
            f"{what} is {worst:.1f} dB from exact Q/DQ (its arithmetic rounds differently) but as accurate: "
            f"its SQNR against FP32 is within {MAX_SQNR_LOSS_DB:g} dB of exact's, or above",
        )
    return ParityVerdict(True, worst, gap, f"{what} agrees with exact Q/DQ within tolerance")


def _as_accurate(evaluation: dict[str, Any]) -> bool:
    """Whether every output of the deployed model is within ``MAX_SQNR_LOSS_DB`` of exact Q/DQ's SQNR
    against FP32 (SQNR None: equal to FP32, which only an equal deployed output matches)."""
    exact = evaluation["qdq_exact"]["outputs"]
    deployed = evaluation.get("qdq_deployed", {}).get("outputs")
    if not exact or not deployed or exact.keys() != deployed.keys():
        return False
    for name, measured in exact.items():
        ours, theirs = measured.get("sqnr_db"), deployed[name].get("sqnr_db")
        if theirs is not None and (ours is None or theirs < ours - MAX_SQNR_LOSS_DB):
            return False
    return True


def remedy(config: QuantizeConfig) -> tuple[QuantizeConfig, str] | None:
    """A config that removes the known cause of disagreement on ``config``'s platform, with the reason;
    None when there is nothing left to try."""
    platform = PLATFORMS[config.platform]
    if platform.reduced_range_remedy and this_cpu_saturates_u8s8() and not weight_range(config.reduce_range).reduced:
        return replace(config, reduce_range="on"), (
            "re-exported with 7-bit weights [-64, 63] (reduce_range=on): the full-range weights, stored as uint8 "
            "for the u8u8 kernels of a CPU without VNNI, deployed beyond tolerance from exact Q/DQ, and 7-bit "
            "weights run on its u8s8 kernels, the ones the rest of its tests hold to"
        )
    return None


def _cause(optimizer: str) -> str:
    """What is known of why ``optimizer`` changes results on this machine ("" when nothing is)."""
    if optimizer == INTEGER_KERNEL_REWRITE and this_cpu_saturates_u8s8():
        return (
            " (it puts in the integer kernels, and this x86 CPU lacks VNNI: they add pairs of products of full-range "
            "int8 weights in a saturating 16-bit intermediate, where TensorRT and VNNI CPUs accumulate in 32 bits)"
        )
    if optimizer == "WeightBiasQuantization":
        return (
            " (it rounds the float biases of Conv/Gemm layers with quantized inputs to int32 multiples of the input's "
            "scale times the weight's, a coarse step at low bit widths)"
        )
    return ""


def isolate_build_failure(config: QuantizeConfig, model_path: str | Path) -> tuple[QuantizeConfig, str] | None:
    """When ONNX Runtime's full optimization cannot build ``model_path`` with ``config``'s disabled
    optimizers: ``config`` with the first of ``SUSPECT_OPTIMIZERS`` whose absence lets it build also
    disabled, and the reason; None when it builds, or when no single suspect is the cause. Costs one
    session build per suspect tried."""
    try:
        with open_session(model_path, device=config.device, disabled_optimizers=config.disabled_optimizers):
            return None
    except QuantcoreError as error:
        failure = str(error)
    for name, candidate in _without_each_suspect(config):
        try:
            with open_session(model_path, device=config.device, disabled_optimizers=candidate.disabled_optimizers):
                pass
        except QuantcoreError:
            continue
        return candidate, (
            f"ONNX Runtime {ort.__version__} cannot build this model at full optimization ({failure[:300]}); "
            f"its graph rewrite {name!r} is the cause: deployed without it, {_how_to_run(candidate)}"
        )
    return None


def _without_each_suspect(config: QuantizeConfig) -> Iterator[tuple[str, QuantizeConfig]]:
    """(suspect, ``config`` with it also disabled), in ``SUSPECT_OPTIMIZERS`` order, skipping those already off."""
    for name in SUSPECT_OPTIMIZERS:
        if name not in config.disabled_optimizers:
            yield name, replace(config, disabled_optimizers=(*config.disabled_optimizers, name))


def _how_to_run(config: QuantizeConfig) -> str:
    return f"run the model with InferenceSession(..., disabled_optimizers={list(config.disabled_optimizers)!r})"


@dataclass(frozen=True)
class Isolated:
    """A deployment that agrees with exact Q/DQ once ``config.disabled_optimizers`` are skipped."""

    config: QuantizeConfig
    evaluation: dict[str, Any]
    reason: str


def isolate_optimizer(
    config: QuantizeConfig, evaluate_with: Callable[[QuantizeConfig], dict[str, Any]]
) -> Isolated | None:
    """The first of ``SUSPECT_OPTIMIZERS`` whose absence from the deployed session makes it agree with
    exact Q/DQ (``evaluate_with(config)`` runs the evaluation with ``config``), or None when none does.
    Costs one evaluation per suspect tried; runs only after a disagreement."""
    for name, candidate in _without_each_suspect(config):
        evaluation = evaluate_with(candidate)
        if check_parity(evaluation).agree:
            return Isolated(
                candidate,
                evaluation,
                f"ONNX Runtime {ort.__version__}'s graph rewrite {name!r} changes this model's results{_cause(name)}; "
                f"deployed measured without it: {_how_to_run(candidate)}",
            )
    return None
