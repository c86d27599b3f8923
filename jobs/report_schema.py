"""The schema of report.json (format ``quantcore.report/1``), as the worker's engine writes it: the
response model of `GET /jobs/{id}/report`, so the OpenAPI document describes every section.

Fields added after the first format version have defaults, so older reports still validate.
Models accept fields they do not list (``extra="allow"``) so that a report written by a newer engine
is served rather than refused; the test suite checks that a real report has no field this schema
leaves undocumented. Metrics that are undefined (the SQNR of a perfect match, top-1 without labels)
are null, never a stand-in number.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Section(BaseModel):
    model_config = ConfigDict(extra="allow")


# ---- config (quantcore.config.QuantizeConfig.to_dict) ----


class WeightOnlyConfig(_Section):
    algorithm: Literal["rtn", "gptq"]
    block_size: int = Field(description="Weights per scale along the reduction axis K (the last block may be short).")
    symmetric: bool = Field(description="true: zero point 2^(bits-1) for every block; false: one per block.")
    format: Literal["matmulnbits", "dequantize_linear"]
    act_order: bool = Field(description="gptq: rows visited by decreasing H diagonal (block scales computed first).")
    damping: float = Field(description="gptq: λ = damping · mean(diag H) added to H's diagonal.")
    quantize_lm_head: bool = Field(description="Whether the LM head was quantized too (kept float by default).")


class OverrideConfig(_Section):
    pattern: str
    bits: int | None
    observer: str | None


class AnalysisConfig(_Section):
    enabled: bool
    graphwise_samples: int | None
    layerwise_samples: int
    max_layers: int
    layerwise_seconds: float | None = None


class TargetConfig(_Section):
    metric: Literal["top1_drop", "cosine", "sqnr"]
    threshold: float
    max_float_layers: int | None


class AutoConfig(_Section):
    budget_seconds: float
    objective: TargetConfig
    candidates: list[str] | None = Field(description="The candidates asked for; null: all that apply.")


class ReconstructionConfig(_Section):
    method: Literal["adaround", "brecq", "qdrop"]
    iters: int = Field(description="Optimizer steps per block.")
    batch_size: int
    num_samples: int = Field(description="Calibration samples whose block inputs and outputs were cached.")
    weight_lr: float | None
    activation_lr: float
    rounding_loss_weight: float = Field(description="λ of the rounding regularizer Σ(1 - |2h(V) - 1|^β).")
    warmup: float = Field(description="Fraction of the steps without the rounding regularizer.")
    beta_start: float
    beta_end: float
    drop_prob: float = Field(description="qdrop: probability of dropping an activation's quantization.")
    cache_bytes: int
    seed: int
    threads: int


class RunConfig(_Section):
    platform: str
    precision: str
    observer: str
    percentile: float = Field(description="The percentile the run used: the one the search kept, if it ran.")
    percentile_candidates: list[float] = Field(default_factory=list)
    clip: Literal["percentile", "mse"] = Field(
        "percentile",
        description="Where tensors observed by percentile were clipped: at the percentile, or at the threshold "
        "minimising their quantization error estimated on the same histogram (kept by the search).",
    )
    batch_size: int
    exclude_op_types: list[str]
    exclude_node_patterns: list[str] = Field(description="Includes the layers the accuracy-target mode kept in float.")
    overrides: list[OverrideConfig]
    reduce_range: str
    device: str
    disabled_optimizers: list[str] = Field(
        default_factory=list, description="ONNX Runtime graph rewrites the deployed session skips (see parity)."
    )
    cpu_latency: bool = Field(title="CPU latency")
    tensorrt_engine: bool = Field(title="TensorRT engine")
    analysis: AnalysisConfig | None = None
    target: TargetConfig | None = None
    reconstruction: ReconstructionConfig | None = None
    equalization: bool = Field(
        False, description="Whether cross-layer equalization rescaled the prepared model's layer pairs."
    )
    bias_correction: bool = Field(
        False, description="Whether the quantized layers' biases were corrected for their weights' mean shift."
    )
    smoothquant: bool = Field(
        False,
        description="Whether SmoothQuant was asked for: MatMul/Gemm inputs' outlier channels moved into their "
        "weights (the prepare stage's message gives the layers smoothed and the alpha kept).",
    )
    strategy: Literal["fixed", "auto"] = Field(
        "fixed",
        description="fixed for the files written, also after an auto search: this config, run again, gives them "
        "(the search itself is the report's auto section).",
    )
    auto: AutoConfig | None = Field(None, description="The auto search's settings (read with strategy auto only).")
    cpu_objective: Literal["accuracy", "latency", "size"] = Field(
        "accuracy",
        title="CPU objective",
        description="latency: the place stage kept in float the regions that ran slower quantized (see placement).",
    )
    cpu_threads: int | None = Field(None, title="CPU threads", description="null: every core of the worker.")
    cpu_batch_sizes: list[int] = Field(default_factory=lambda: [1, 32], title="CPU batch sizes")
    weight_only: WeightOnlyConfig | None = Field(None, description="Platform onnxruntime-weight-only only.")


# ---- prepare, annotate, calibrate ----


class FoldedBatchNorm(_Section):
    node: str
    batchnorm: str
    output: str


class Preparation(_Section):
    source_opset: int
    opset: int
    folded_batchnorms: list[FoldedBatchNorm]
    folded_constants: int
    renamed_nodes: int
    widened_from: Literal["float16", "bfloat16", "bfloat16 and float16"] | None = Field(
        None,
        description="The half-precision type(s) the model computed in, made to compute in float32 inside to be "
        "quantized (its inputs and outputs keep their types; errors are against its float32 computation); null "
        "for a float32 model.",
    )


class NodeDecision(_Section):
    node: str
    decision: Literal["quantized", "pass_through", "float", "excluded"]
    reason: str


class AnnotationSummary(_Section):
    platform: str | None
    quantized_activations: int
    quantized_weights: int
    quantized_biases: int
    nodes: dict[str, int] = Field(description="Count of nodes per decision.")
    excluded_nodes: list[str]
    decisions: list[NodeDecision]
    notes: list[str]
    warnings: list[str]
    auto: AutoSearch | None = Field(None, description="Null for strategy fixed.")
    dataset: DatasetSplit | None = Field(
        None, description="The seeded calibration/evaluation split (recorded by the service, not by quantcore)."
    )


class PercentileCandidate(_Section):
    clip: Literal["percentile", "mse"] = "percentile"
    percentile: float | None = Field(description="The candidate's percentile (null: the MSE threshold).")
    sqnr_db: float | None = Field(description="Worst output SQNR on the search samples (null: exact, or not finite).")


class PercentileSearch(_Section):
    chosen: float = Field(description="The percentile the run went on with (with clip mse: the configured one).")
    clip: Literal["percentile", "mse"] = Field("percentile", description="The kind of candidate kept.")
    samples: int
    candidates: list[PercentileCandidate]


class CalibrationSummary(_Section):
    num_samples: int
    batch_size: int
    num_batches: int
    percentile_search: PercentileSearch | None = Field(
        None,
        description="The clipping percentile, or MSE threshold, kept among the candidates (null: no search ran: "
        "observer not percentile, no candidates, or fewer than 64 calibration samples).",
    )


# ---- evaluate ----


class OutputMetrics(_Section):
    sqnr_db: float | None = Field(description="10·log10(Σx² / Σ(x - x̂)²); null for a perfect match.")
    cosine: float | None
    max_abs_error: float | None
    mean_abs_error: float | None
    argmax_agreement: float | None = Field(description="Rank >= 2 outputs only.")
    relative_error_p50: float | None = Field(None, description="Median over samples of ‖x - x̂‖ / ‖x‖.")
    relative_error_p90: float | None = None
    relative_error_p99: float | None = None
    nonfinite: int = Field(
        description="NaN/inf values in the quantized output where FP32's output is not the same NaN/inf (the same "
        "value agrees and is left out of the other metrics); all metrics are null when > 0."
    )
    exact_match: float | None = Field(None, description="Fraction of elements equal to FP32's (NaN = NaN).")
    comparison: Literal["numeric", "equality"] = Field(
        "numeric",
        description="numeric: a float output (a ZipMap's class probabilities as a (samples, classes) array), every "
        "metric; equality: any other output (integer ids, strings, ...), exact_match only.",
    )


class ModelSizes(_Section):
    fp32_bytes: int
    qdq_bytes: int
    quantize_linear_nodes: int = Field(description="QuantizeLinear and DynamicQuantizeLinear nodes.")
    dequantize_linear_nodes: int


class TaskScores(_Section):
    top1: float | None
    task_metrics: dict[str, float | None] = Field(
        default_factory=dict, description="Every registered task metric (top1, top5, ...); empty without labels."
    )


class ModeResult(TaskScores):
    outputs: dict[str, OutputMetrics]


class DeployedResult(ModeResult):
    kernels: dict[str, int] | None = Field(description="Op types of the graph ONNX Runtime runs.")
    integer_kernels: int | None
    float_compute_kernels: int | None
    skipped: str | None
    fallback: str | None
    disabled_optimizers: list[str] = Field(
        default_factory=list,
        description="ONNX Runtime graph rewrites skipped because they change this model's results (see parity).",
    )


class Evaluation(_Section):
    model: ModelSizes
    num_samples: int
    batch_size: int
    top1_output: str | None
    fp32: TaskScores
    qdq_exact: ModeResult
    qdq_deployed: DeployedResult
    latency_ms_per_sample: dict[str, float | None]
    deployed_vs_exact: dict[str, OutputMetrics]


class Parity(_Section):
    agree: bool | None
    min_sqnr_db: float | None
    top1_gap: float | None
    tolerance: dict[str, float]
    reason: str
    remedy: str | None
    before_remedy: dict[str, Any] | None


# ---- analyze ----


class GraphwiseBounds(_Section):
    samples: int
    runs_per_batch: int
    batch_size: int | None = Field(None, description="Samples a run took.")


class LayerwiseBounds(_Section):
    samples: int
    layers_total: int
    layers_analyzed: int
    runs_per_batch: int
    bounds: AnalysisConfig
    seconds_per_run: float | None = Field(
        None, description="A whole run of the first sample, pricing layerwise_seconds."
    )
    layer_run_fraction: float | None = Field(
        None, description="Wall time of a layer's run (on the graph downstream of it) against a whole run, measured."
    )
    statement: str


class LayerHarm(_Section):
    rank: int = Field(description="1 = the most harmful layer.")
    node: str
    op_type: str
    tensors: list[str] = Field(description="The quantized tensors the node reads.")
    sqnr_db: float | None = Field(description="Worst output SQNR to FP32 with only this layer quantized.")
    cosine: float | None
    nonfinite: bool
    analyzed: bool = Field(description="False when the layer-wise run was skipped (max_layers).")
    local_sqnr_db: float | None


class TensorStats(_Section):
    tensor: str
    kind: Literal["activation", "weight"]
    graphwise_sqnr_db: float | None = Field(description="At this tensor, fully quantized model vs FP32.")
    local_sqnr_db: float | None = Field(description="This tensor's own quantization alone.")
    observed_min: float | None
    observed_max: float | None
    range_min: float = Field(description="Lowest value the chosen clipping keeps.")
    range_max: float
    clipped_fraction: float | None
    channel_range_ratio: float | None = Field(description="Weights: max / median of the per-channel |max|.")


class Analysis(_Section):
    graphwise: GraphwiseBounds
    layerwise: LayerwiseBounds
    layers: list[LayerHarm] = Field(description="Ranked by harm, most harmful first.")
    tensors: list[TensorStats]


# ---- target ----


class TargetStep(_Section):
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


class AutoSelection(_Section):
    calibration_samples: int = Field(description="Calibration samples each candidate calibrated on.")
    selection_samples: int = Field(description="The last calibration samples, held out and scored on.")
    fraction: float


class AutoCandidateResult(_Section):
    name: str
    change: str = Field(description="What the candidate changed in the recipe, in words.")
    value: float | None = Field(description="The objective's metric on the selection split; null: undefined or failed.")
    met: bool
    qdq_bytes: int | None
    latency_p50_ms: float | None = Field(
        description="The deployed model's CPU EP latency at batch 1 (p50, ms); null: not measured."
    )
    seconds: float
    error: str | None = Field(description="Why the candidate produced no model (it was skipped); null: it did.")
    pareto: bool = Field(description="On the accuracy/size Pareto front of the candidates that produced a model.")


class AutoFallback(_Section):
    from_: str = Field(alias="from", description="The best candidate the accuracy-target method started from.")
    dropped: list[str] = Field(description="What the target method cannot be combined with, dropped from it.")
    float_layers: list[str] = Field(description="Layers kept in float (added to config.exclude_node_patterns).")
    value: float | None
    met: bool
    verdict: str | None
    seconds: float
    error: str | None


class AutoSearch(_Section):
    """The search of strategy auto: every candidate tried on the selection split, the one chosen and why."""

    objective: AutoObjective
    measured_on: str
    selection: AutoSelection
    budget_seconds: float
    candidates: list[AutoCandidateResult]
    stopped: str | None = Field(description="Why the search stopped before its last candidate (the budget); null.")
    chosen: str
    fallback: AutoFallback | None = Field(description="Null when a candidate met the objective (or no time was left).")
    met: bool = Field(description="Whether the objective was met on the selection split.")
    reason: str = Field(description="The choice in one sentence.")
    seconds: float


# ---- reconstruction ----


class ReconstructedBlock(_Section):
    name: str
    kind: Literal["layer", "layers", "residual"]
    nodes: list[str]
    weights: list[str] = Field(description="The weight tensors whose rounding was learned.")
    status: Literal["reconstructed", "kept_nearest", "unsupported", "nothing_to_learn"] = Field(
        description="kept_nearest: the learned rounding did worse than round-to-nearest on the cached samples."
    )
    iters: int
    loss_before: float | None = Field(description="Block output MSE with round-to-nearest.")
    loss_after: float | None = Field(description="Block output MSE with the hardened learned rounding.")
    seconds: float
    cache: Literal["memory", "disk"] | None
    warning: str | None


class Reconstruction(ReconstructionConfig):
    device: str
    blocks: list[ReconstructedBlock]


# ---- dataset split (written by the service) ----


class SplitPart(_Section):
    count: int
    sha256: str


class DatasetSplit(_Section):
    kind: Literal["arrays", "images"]
    seed: int
    num_samples: int
    batch_axes: dict[str, int | None] | None = Field(
        None,
        description="Per model input, the axis its samples were counted and split along (1 for a state "
        "declared (2, batch, 128)); null: a constant input, given whole to both parts.",
    )
    calibration: SplitPart
    evaluation: SplitPart
    hashed: str = Field(description="What the SHA-256 digests cover (sample indices or member names).")
    label_source: str | None
    classes: list[str] | None = None


# ---- latency, engine ----


class LatencyStats(_Section):
    batch: int
    runs: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    throughput_samples_per_s: float | None


class CpuLatency(_Section):
    device: str
    provider: str
    onnxruntime: str
    threads: int | None
    cpu_count: int | None = Field(title="CPU count")
    warmup: int
    runs: int
    budget_s: float | None = Field(
        None, description="Seconds of timed runs after which a measurement stops (runs is then a maximum)."
    )
    batch_sizes: list[int]
    fp32: dict[str, LatencyStats]
    quantized: dict[str, LatencyStats]
    speedup_p50: dict[str, float | None]
    notes: list[str]


class PlacementTiming(_Section):
    p25_ms: float
    p50_ms: float = Field(description="The median of the interleaved runs.")
    p75_ms: float = Field(description="p25 to p75 is the spread a decision must exceed.")
    runs: int


class PlacementPair(_Section):
    quantized: PlacementTiming | None = Field(description="The model with the region quantized; null: refused.")
    float: PlacementTiming | None = Field(description="The same model with the region's nodes float; null: refused.")


class PlacementRegion(_Section):
    round: int
    nodes: list[str] = Field(description="The region's quantized nodes, joined by quantized tensors.")
    op_types: dict[str, int]
    timings: dict[str, PlacementPair] = Field(description="Per batch size (batch_1, ...).")
    cached: bool = Field(description="Timings read from the worker's timing cache instead of measured.")
    kept: Literal["quantized", "float"]
    reason: str


class PlacementFinal(_Section):
    fp32: PlacementTiming | None = Field(None, title="FP32", description="The prepared model, nothing quantized.")
    quantized: PlacementTiming | None = Field(None, description="Every region quantized (accuracy's model).")
    placed: PlacementTiming | None = Field(None, description="The model with the regions slower quantized in float.")
    speedup_p50: float | None = Field(description="FP32 p50 / the kept model's p50.")


class Placement(_Section):
    objective: Literal["latency"]
    threads: int = Field(description="ONNX Runtime intra-op threads of every measurement.")
    batch_sizes: list[int]
    cpu: str = Field(title="CPU", description="The CPU model the timings are of.")
    onnxruntime: str
    rounds: int
    stopped: str = Field(description="Why the search stopped: no region changed, the round limit, the time budget.")
    regions: list[PlacementRegion] = Field(description="Every region measured, round by round.")
    kept: Literal["quantized", "placed", "fp32"] = Field(
        description="The model kept: quantized (every region), placed, or fp32 (every region float): the most "
        "quantized one that no less quantized one is clearly faster than."
    )
    float_nodes: list[str] = Field(description="Nodes kept float for speed (added to config.exclude_node_patterns).")
    final: dict[str, PlacementFinal] = Field(description="FP32, all quantized and placed timed together, per batch.")
    final_cached: bool
    measurements: int = Field(description="Timer calls made (0 on a cached rerun).")
    cached_measurements: int
    measured_seconds: float
    statement: str


class Latency(_Section):
    cpu: CpuLatency | None = Field(title="CPU latency")


class EngineSummary(_Section):
    status: str = Field(description="built, skipped or failed.")
    reason: str | None
    engine_path: str | None
    metadata: dict[str, Any]
    qdq_checks: dict[str, Any]
    layers: list[Any]
    precision_notes: list[str]
    comparison: dict[str, Any] | None
    latency: dict[str, Any] | None
    errors: list[Any]
    log: list[str]


# ---- weight-only (quantcore.pipeline.weight_only) ----


class WeightOnlyLayer(_Section):
    node: str
    op_type: Literal["MatMul", "Gemm"]
    weight: str = Field(description="The FP32 initializer replaced by the stored codes.")
    shape: list[int] = Field(description="[K, N]: the reduction axis first.")
    fp32_bytes: int
    stored_bytes: int = Field(description="Packed codes, scales and zero points of this layer.")
    output_error: float | None = Field(
        None,
        description="gptq: ||XW - XŴ||² / ||XW||² on the calibration data (X the layer's input), of the weight kept.",
    )
    rtn_output_error: float | None = Field(None, description="gptq: the same of round-to-nearest, for comparison.")
    damping: float | None = Field(None, description="gptq: the damping used (raised x10 when H was not definite).")


class WeightOnlyFloatLayer(_Section):
    node: str
    op_type: str
    weight: str
    reason: str = Field(description="Why it stays float (LM head, embedding, tied weight, shape).")


class WeightOnlySize(_Section):
    fp32_model_bytes: int
    model_bytes: int = Field(description="The exported model's file(s).")
    quantized_layers_fp32_bytes: int
    quantized_layers_bytes: int
    quantized_layers_ratio: float | None = Field(description="quantized_layers_bytes / quantized_layers_fp32_bytes.")


class WeightOnlySection(WeightOnlyConfig):
    bits: Literal[4, 8]
    layers: list[WeightOnlyLayer] = Field(description="The layers quantized, in graph order.")
    kept_float: list[WeightOnlyFloatLayer] = Field(description="MatMul/Gemm/Gather with a weight kept float, and why.")
    size: WeightOnlySize
    next_token_agreement: dict[str, float] = Field(
        description="Per output of rank >= 3 (batch, positions, vocabulary): the fraction of positions whose "
        "argmax (the next token) the deployed model shares with FP32."
    )
    notes: list[str] = Field(description="What the deployed model computes beyond the stored weights.")


class Report(_Section):
    """A job's report.json."""

    format: str
    config: RunConfig
    prepare: Preparation
    annotation: AnnotationSummary
    calibration: CalibrationSummary
    reconstruction: Reconstruction | None = Field(None, description="Null without reconstruction in the recipe.")
    evaluation: Evaluation
    parity: Parity
    analysis: Analysis | None = Field(
        None,
        description="Null when the recipe turned the analysis off, or the machine lacked its memory (see warnings).",
    )
    target: TargetOutcome | None = Field(None, description="Null without a target in the recipe.")
    latency: Latency
    engine: EngineSummary | None
    stage_seconds: dict[str, float]
    resumed: list[str] = Field(
        default_factory=list, description="Stages reused from an earlier attempt's checkpoint instead of run."
    )
    warnings: list[str]
    auto: AutoSearch | None = Field(None, description="Null for strategy fixed.")
    placement: Placement | None = Field(None, description="Null unless deploy.cpu_objective is latency.")
    weight_only: WeightOnlySection | None = Field(
        None, description="Platform onnxruntime-weight-only: options, layers quantized and kept float, sizes."
    )
    dataset: DatasetSplit | None = Field(
        None, description="The seeded calibration/evaluation split (recorded by the service, not by quantcore)."
    )
