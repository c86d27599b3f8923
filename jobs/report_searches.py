"""The report's sections of the searches that run stages again: the accuracy target, strategy auto and
the CPU placement (part of ``jobs.report_schema``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from jobs.report_config import MixedPrecisionObjective, Section, TargetConfig


class PlacementTiming(Section):
    """One model's interleaved CPU timings at one batch size (``quantcore.evaluate.paired_latency``)."""

    min_ms: float | None = Field(None, description="The fastest run (null in reports written before it was kept).")
    p25_ms: float
    p50_ms: float = Field(description="The median of the interleaved runs.")
    p75_ms: float = Field(description="p25 to p75 is the spread a decision must exceed.")
    high_ms: float | None = Field(
        None,
        description="The slowest run, or of 4 runs or more the slowest but one: load lengthens runs, one is let off "
        "(null in reports written before it was kept).",
    )
    runs: int


# ---- target ----


class TargetStep(Section):
    step: int
    float_layers: list[str]
    value: float | None = Field(description="The target metric after this step.")
    met: bool
    top1: float | None
    qdq_bytes: int
    latency_ms_per_sample: float | None
    calibration: Literal["reused", "recalibrated"] | None
    seconds: float


class TargetOutcome(TargetConfig):
    statement: str
    measured_on: Literal["qdq_deployed", "qdq_exact"]
    met: bool
    verdict: str
    chosen_step: int
    float_layers: list[str]
    ranked_layers: int
    search: str
    steps: list[TargetStep]


# ---- auto (quantcore.auto) ----


class AutoObjective(TargetConfig):
    statement: str


class AutoSelection(Section):
    calibration_samples: int = Field(description="Calibration samples each candidate calibrated on.")
    selection_samples: int = Field(description="The last calibration samples, held out and scored on.")
    fraction: float


class PairedDifference(Section):
    """One score minus another on the same samples, and its 95 % paired bootstrap interval."""

    value: float
    low: float
    high: float


class AutoCandidateResult(Section):
    name: str
    change: str = Field(description="What the candidate changed in the recipe, in words.")
    value: float | None = Field(description="The objective's metric on the selection split; null: undefined or failed.")
    met: bool
    qdq_bytes: int | None
    latency_p50_ms: float | None = Field(
        description="The deployed model's CPU EP latency at batch 1 (p50, ms); null: not measured."
    )
    seconds: float
    error: str | None = Field(
        description="Why the candidate produced no model: its run failed or was stopped by the budget, or it was "
        'skipped, its method finding nothing to change in the model ("skipped: ..."); null: it did.'
    )
    pareto: bool = Field(
        description="On the accuracy/latency/size Pareto front of the candidates that produced a model (latency "
        "where measured)."
    )
    final_seconds: float | None = Field(
        None, description="Its final run's estimated seconds (all calibration samples, the evaluation data)."
    )
    difference: PairedDifference | None = Field(
        None,
        description="Its score minus the most accurate one's (the one chosen, unless speed chose a faster one; "
        "positive: better) with the paired 95 % bootstrap interval on the selection split; null for that one, "
        "those that produced no model and undefined scores.",
    )


class AutoFallback(Section):
    from_: str = Field(alias="from", description="The best candidate the accuracy-target method started from.")
    dropped: list[str] = Field(description="What the target method cannot be combined with, dropped from it.")
    float_layers: list[str] = Field(description="Layers kept in float (added to config.exclude_node_patterns).")
    value: float | None
    met: bool
    verdict: str | None
    seconds: float
    error: str | None


class AutoSpeedCompared(Section):
    name: str = Field(description="The candidate timed.")
    stands_for: list[str] = Field(
        description="The other candidates that meet the objective and deploy the same graph (the same speed)."
    )
    timings: dict[str, PlacementTiming] = Field(
        default_factory=dict, description="Per batch size (batch_1, ...); empty where not timed."
    )
    error: str | None = Field(None, description="Why ONNX Runtime could not time it; null.")


class AutoSpeed(Section):
    """With deploy.cpu_objective latency, where the most accurate candidate meets the objective: the others
    that meet it (across the bootstrap interval) timed against it, one per deployed graph."""

    most_accurate: str = Field(description="The candidate the accuracy comparison kept, timed against the others.")
    compared: list[AutoSpeedCompared]
    batch_sizes: list[int] | None = None
    threads: int | None = None
    left_out: str | None = Field(None, description="Why the larger batch sizes were not timed; null: none was.")
    reused: bool = Field(False, description="The timings of the base candidate's comparison, the same two graphs.")
    seconds: float | None = Field(None, description="Of the timing runs; null: not timed.")
    verdict: str = Field(description="Which was kept and why, or why nothing was timed.")


class AutoSearch(Section):
    """The search of strategy auto: every candidate tried on the selection split, the one chosen and why."""

    objective: AutoObjective
    measured_on: str
    selection: AutoSelection
    budget_seconds: float
    candidates: list[AutoCandidateResult]
    stopped: str | None = Field(description="Why the search stopped before its last candidate (the budget); null.")
    chosen: str = Field(description="The candidate the final run ran (the most accurate, or a faster one: speed).")
    final_seconds: float | None = Field(
        None, description="The final run's estimated seconds, held back from the budget during the search."
    )
    speed: AutoSpeed | None = Field(
        None,
        description="Null unless the deployment favours latency and the most accurate candidate met the objective.",
    )
    fallback: AutoFallback | None = Field(description="Null when a candidate met the objective (or no time was left).")
    met: bool = Field(description="Whether the objective was met on the selection split.")
    reason: str = Field(description="The choice in one sentence.")
    seconds: float


# ---- placement (quantcore.analysis.placement) ----


class PlacementPair(Section):
    quantized: PlacementTiming | None = Field(description="The model with the region quantized; null: refused.")
    float: PlacementTiming | None = Field(description="The same model with the region's nodes float; null: refused.")


class PlacementEstimate(Section):
    float_us: float = Field(description="The region's nodes in the FP32 model's node profile (µs, median of runs).")
    quantized_us: float = Field(description="Its integer kernels and Q/DQ conversions in the QDQ model's profile.")


class PlacementRegion(Section):
    round: int
    nodes: list[str] = Field(description="The region's quantized nodes (joined by quantized tensors).")
    op_types: dict[str, int]
    estimate: dict[str, PlacementEstimate] = Field(
        description="Per batch size (batch_1, ...), from ONNX Runtime's profiles; empty where none was traced."
    )
    cost: float | None = Field(
        description="Sum over batch sizes of (quantized_us - float_us) / the FP32 profile's total: above 0, the "
        "region goes float; null: no estimate, the region was timed as a whole-model pair instead."
    )
    timings: dict[str, PlacementPair] = Field(
        description="Per batch size, the whole-model pair of a region without an estimate; empty otherwise."
    )
    cached: bool = Field(description="Profiles or timings read from the worker's timing cache instead of measured.")
    kept: Literal["quantized", "float"]
    reason: str


class PlacementFinal(Section):
    fp32: PlacementTiming | None = Field(None, title="FP32", description="The prepared model, nothing quantized.")
    quantized: PlacementTiming | None = Field(None, description="Every region quantized (accuracy's model).")
    placed: PlacementTiming | None = Field(None, description="The model with the regions slower quantized in float.")
    speedup_p50: float | None = Field(description="FP32 p50 / the kept model's p50.")


class Placement(Section):
    objective: Literal["latency"]
    threads: int = Field(description="ONNX Runtime intra-op threads of every measurement.")
    batch_sizes: list[int]
    cpu: str = Field(title="CPU", description="The CPU model the timings are of.")
    onnxruntime: str
    rounds: int
    stopped: str = Field(
        description="Why the search stopped: no region changed the model, no quantized region left, the round limit, "
        "or the timing budget (no room to profile the next round's model)."
    )
    regions: list[PlacementRegion] = Field(description="Every region estimated (or timed), round by round.")
    kept: Literal["quantized", "placed", "fp32"] = Field(
        description="The model kept: quantized (every region), placed, or fp32 (every region float). The placed one "
        "(or, where it has no quantized region left, the quantized one) when the last profile's runs find it no "
        "slower than FP32: clearly slower at no batch size and its median within 2 % of FP32's at every one, "
        "on at least 7 runs of each at every batch size, or 4 lying 10 % apart, each one's slowest let off. "
        "Otherwise, from the final comparison: of the two quantized ones the placed one only where clearly faster, "
        "and that one only where no slower than FP32 (as above, or clearly faster at one batch size), else the "
        "other, else FP32."
    )
    float_nodes: list[str] = Field(description="Nodes kept float for speed (added to config.exclude_node_patterns).")
    final: dict[str, PlacementFinal] = Field(
        description="Per batch size, the timings the choice read: FP32 and the model judged, from the profile; or "
        "FP32, all quantized and placed timed together."
    )
    final_source: Literal["profile", "timed", "profiles"] = Field(
        description="profile: the last profile's runs (FP32 and the model judged, interleaved) decided, nothing more "
        "was timed; timed: the final whole-model comparison did; profiles: the timing budget had no room for that "
        "comparison, and its rule read each quantized model's profile runs against FP32's in the same round (only "
        "where they keep FP32, or number at least 7 of each at every batch size, or 4 lying 10 % apart, each one's "
        "slowest let off: else the comparison is timed)."
    )
    final_cached: bool
    measurements: int = Field(description="Node profiles and whole-model timings made (0 on a cached rerun).")
    cached_measurements: int
    measured_seconds: float = Field(description="Wall-clock seconds of the measurements made (sessions included).")
    timed_seconds: float = Field(
        description="Seconds of timed runs of every measurement read or made, cached or not: what the budget counts."
    )
    timing_budget_s: float = Field(
        description="Seconds of timed runs the measurements after the first profile may bring the total to: the "
        "calibration's seconds (a resumed job's: its checkpoint's) times config.cpu_timing_share. A measurement "
        "whose minimum runs would exceed it is not made, but for the final comparison where past_budget says why."
    )
    past_budget: str | None = Field(
        default=None,
        description="Why the final comparison was timed past the budget: the profile runs that would have kept a "
        "quantized model were too few (under 7 at a batch size, and not 4 lying 10 % apart) to promise it "
        "no slower than FP32.",
    )
    statement: str


# ---- mixed precision (quantcore.analysis.mixed_precision) ----


class MixedPrecisionStep(Section):
    promoted: int = Field(
        description="How many of the ranked layers this step promoted (0: the baseline, calibrated like the steps)."
    )
    layers: list[str]
    value: float | None = Field(description="The objective's metric on the scored calibration samples.")
    calibration: Literal["reused", "recalibrated"] | None = Field(
        description="reused: the baseline's scales; recalibrated: on the calibration part the steps share; null: "
        "the run's own calibration (no sample could be held out)."
    )
    seconds: float


class MixedPrecisionLayer(Section):
    layer: str
    op_type: str
    layer_sqnr_db: float | None = Field(description="Its layer-wise SQNR when it alone was quantized (the ranking).")
    tensors: dict[str, str] = Field(
        description="Tensor it reads → what it became: int16 or uint16, or float32 where the layer is kept float."
    )


class MixedPrecisionObjectiveStated(MixedPrecisionObjective):
    statement: str


class MixedPrecisionOutcome(Section):
    form: Literal["int16", "float"] = Field(
        description="int16: the layers' tensors at 16 bits (ONNX Runtime runs the layer in float between 16-bit "
        "Q/DQ); float: the layers kept float32 (TensorRT takes no 16-bit tensors)."
    )
    max_fraction: float
    objective: MixedPrecisionObjectiveStated
    measured_on: str
    ranking_samples: int | None = Field(
        description="Calibration samples the layer-wise ranking ran on; null (and the three below): the model met "
        "the objective as quantized, and nothing was ranked."
    )
    quantizable_layers: int | None
    cap: int | None = Field(description="At most this many layers promoted: max_fraction of the quantizable, >= 1.")
    candidates: int | None = Field(description="Ranked layers whose quantization changed the outputs.")
    steps: list[MixedPrecisionStep] = Field(description="Empty when the model met the objective as quantized.")
    promoted: list[MixedPrecisionLayer]
    before: float | None = Field(description="The metric of the model as the run quantized it, on the scored samples.")
    after: float | None = Field(
        description="The metric of the step kept (as the search calibrated it; the exported model is calibrated on "
        "every calibration sample)."
    )
    met: bool
    statement: str
