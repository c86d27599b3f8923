"""The configurations ``strategy="auto"`` tries: each a named, small variation of the user's config, as data.

``CANDIDATES`` lists them cheapest first; adding one is one entry (and its name in
``quantcore.config.AUTO_CANDIDATES``, which a test pins to this list). A candidate *applies* to a config when
its variation is a valid config for that platform and differs from the config as given (``as_given`` always
applies): an observer the config already uses, equalization already on, or bias correction on a config
with a reconstruction is not tried twice or at all. A candidate whose method finds nothing to change in the
prepared model (``Candidate.unchanged``: no layer pair to equalize, no layer bias to correct or weights already
on their grids, no MatMul/Gemm to smooth) would only run the config as given again: the search records it as
skipped, with why, and spends no time on it.

    as_given         the config as given (percentile with its clip search, by default)
    full_weights     full int8 weights where the config as given keeps 7-bit ones: on an x86 CPU without VNNI,
                     ``reduce_range="auto"`` trades a bit of every weight for ONNX Runtime's fast u8s8 kernels,
                     and ``off`` keeps the bit for its slower, exact u8u8 ones (``quantcore.runtime.cpu_features``).
                     A base: where it is kept, the later candidates keep full weights too
    minmax, mse, kl  that activation observer (integer platforms that calibrate activations)
    floating         the FP8 scale search observer (tensorrt-fp8)
    equalization     cross-layer equalization before calibration
    bias_correction  each quantized layer's bias corrected for its weight quantization's mean shift
    smoothquant      MatMul/Gemm and Conv inputs' outlier channels moved into their weights
                     (``quantcore.calibrate.smoothquant``)
    mixed_precision  the most sensitive layers promoted to 16 bits, or kept float where the platform takes no
                     16-bit tensors (``quantcore.analysis.mixed_precision``), until the objective is met on the
                     candidate's calibration samples, at most ``MixedPrecisionConfig``'s default fraction
    adaround         AdaRound learned rounding, ``ADAROUND_ITERS`` steps per layer (the costliest: last)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from quantcore.annotate.annotation import annotate
from quantcore.annotate.platforms import PLATFORMS
from quantcore.calibrate.bias_correction import nothing_to_correct
from quantcore.calibrate.calibration import calibrate_weights
from quantcore.config import MixedPrecisionConfig, QuantizeConfig, ReconstructionConfig
from quantcore.config.choices import MIXED_PRECISION_METRICS
from quantcore.graph.channel_scaling import find_groups
from quantcore.prepare.equalization import find_pairs
from quantcore.prepare.preparation import PreparedModel
from quantcore.runtime.cpu_features import weight_range

# AdaRound steps per layer in the search: a tenth of ReconstructionConfig's default, so that the candidate
# fits a CPU budget of minutes on small models; the budget's deadline stops it where it does not.
ADAROUND_ITERS = 200
# platform -> the activation observers worth a candidate there. onnxruntime-dynamic quantizes its
# activations at run time (nothing to observe); FP8 has its own scale search.
PLATFORM_OBSERVERS: dict[str, tuple[str, ...]] = {
    "tensorrt": ("minmax", "mse", "kl"),
    "onnxruntime": ("minmax", "mse", "kl"),
    "academic": ("minmax", "mse", "kl"),
    "tensorrt-fp8": ("minmax", "floating"),
    "onnxruntime-dynamic": (),
}


@dataclass(frozen=True)
class Candidate:
    """One variation: ``name`` (a key of ``AUTO_CANDIDATES``), ``change`` (what it changes, in words, for
    the report), ``vary`` (config -> config; may raise ValueError where the variation is invalid) and
    ``unchanged`` ((prepared model, the candidate's config) -> why the method would change nothing in it,
    None where it would or only the calibration data can tell; None: no such check). ``base``: a change of
    how the model is deployed, which every method composes with; where the search keeps it, the candidates
    after it vary its config rather than the config as given."""

    name: str
    change: str
    vary: Callable[[QuantizeConfig], QuantizeConfig]
    unchanged: Callable[[PreparedModel, QuantizeConfig], str | None] | None = None
    base: bool = False

    def applied(self, config: QuantizeConfig) -> QuantizeConfig | None:
        """The variation of ``config`` (strategy ``fixed``: a candidate is one fixed run), or None where it
        does not apply (see the module docstring)."""
        base = replace(config, strategy="fixed")
        try:
            varied = self.vary(base)
        except ValueError:  # e.g. bias correction with a reconstruction: not a config this platform runs
            return None
        return varied if varied != base or self.name == "as_given" else None


def _observer(name: str) -> Candidate:
    def vary(config: QuantizeConfig) -> QuantizeConfig:
        if name not in PLATFORM_OBSERVERS[config.platform]:
            raise ValueError(f"observer {name} is not a candidate on platform {config.platform}")
        return replace(config, observer=name)

    return Candidate(name, f"activation observer {name}", vary)


def _full_weights(config: QuantizeConfig) -> QuantizeConfig:
    """``reduce_range="off"`` where the config as given chose 7-bit weights by itself (``auto`` on a CPU whose
    u8s8 kernels saturate); a 7-bit grid the user asked for (``on``) is theirs to keep."""
    if not (PLATFORMS[config.platform].reduced_range_remedy and config.reduce_range == "auto"):
        raise ValueError(f"reduce_range {config.reduce_range!r} on platform {config.platform} is not chosen by the CPU")
    if not weight_range("auto").reduced:
        raise ValueError("this CPU's integer kernels take full int8 weights already")
    return replace(config, reduce_range="off")


def _mixed_precision(config: QuantizeConfig) -> QuantizeConfig:
    """Mixed precision aiming at the search's objective where calibration samples can measure it (cosine,
    SQNR); a top-1 objective, which needs labels, aims at ``MixedPrecisionConfig``'s default instead."""
    objective = config.auto.objective
    if objective.metric in MIXED_PRECISION_METRICS:
        return replace(config, mixed_precision=MixedPrecisionConfig(objective=objective))
    return replace(config, mixed_precision=MixedPrecisionConfig())


CANDIDATES: tuple[Candidate, ...] = (
    Candidate("as_given", "nothing: the config as given", lambda config: config),
    Candidate(
        "full_weights",
        "full int8 weights on ONNX Runtime's exact u8u8 kernels, not 7-bit ones",
        _full_weights,
        base=True,
    ),
    _observer("minmax"),
    _observer("mse"),
    _observer("kl"),
    _observer("floating"),
    Candidate(
        "equalization",
        "cross-layer equalization on",
        lambda config: replace(config, equalization=True),
        lambda prepared, _: None if find_pairs(prepared.model.graph) else "no pair of layers to equalize",
    ),
    Candidate(
        "bias_correction",
        "bias correction on",
        lambda config: replace(config, bias_correction=True),
        lambda prepared, config: nothing_to_correct(
            prepared, calibrate_weights(prepared, annotate(prepared, config), config)
        ),
    ),
    Candidate(
        "smoothquant",
        "SmoothQuant on",
        lambda config: replace(config, smoothquant=True),
        lambda prepared, _: (
            None
            if find_groups(prepared.model.graph, convolutions=True)
            else "no MatMul/Gemm or Conv reading an activation through its own weight"
        ),
    ),
    Candidate(
        "mixed_precision",
        "the most sensitive layers at 16 bits (float on platforms without 16-bit tensors)",
        _mixed_precision,
    ),
    Candidate(
        "adaround",
        f"AdaRound learned rounding, {ADAROUND_ITERS} steps per layer",
        lambda config: replace(config, reconstruction=ReconstructionConfig(method="adaround", iters=ADAROUND_ITERS)),
    ),
)


def candidate_configs(config: QuantizeConfig) -> list[tuple[Candidate, QuantizeConfig]]:
    """The candidates to try for ``config`` (strategy ``auto``), in ``CANDIDATES``' order: those named in
    ``config.auto.candidates`` (None: all) that apply, each with its fixed config. ``as_given`` is always
    first, named or not: it is the baseline every other candidate is a variation of."""
    named = config.auto.candidates
    chosen = []
    for candidate in CANDIDATES:
        if named is not None and candidate.name not in named and candidate.name != "as_given":
            continue
        varied = candidate.applied(config)
        if varied is not None:
            chosen.append((candidate, varied))
    return chosen
