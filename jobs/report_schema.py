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

from pydantic import Field

from jobs.report_config import AnalysisConfig, QatConfig, ReconstructionConfig, RunConfig, Section, WeightOnlyConfig
from jobs.report_searches import (
    AutoSearch,
    MixedPrecisionOutcome,
    PairedDifference,
    Placement,
    PlacementTiming,
    TargetOutcome,
)

# ---- prepare, annotate, calibrate ----


class FoldedBatchNorm(Section):
    node: str
    batchnorm: str
    output: str


class Preparation(Section):
    source_opset: int
    opset: int
    folded_batchnorms: list[FoldedBatchNorm]
    folded_constants: int
    divisions_as_products: list[str] = Field(
        default_factory=list,
        description="Div nodes whose divisor is a constant, made Mul by its reciprocal (same name and output; "
        "within one rounding of the division): an integer kernel can run a product, none runs a division.",
    )
    renamed_nodes: int
    widened_from: Literal["float16", "bfloat16", "bfloat16 and float16"] | None = Field(
        None,
        description="The half-precision type(s) the model computed in, made to compute in float32 inside to be "
        "quantized (its inputs and outputs keep their types; errors are against its float32 computation); null "
        "for a float32 model.",
    )
    equalization: Equalization | None = Field(None, description="Null: not asked for.")
    smoothquant: SmoothQuantOutcome | None = Field(None, description="Null: not asked for.")


class EqualizedPair(Section):
    first: str
    second: str
    activation: str | None = Field(description="The node between the two layers (a ReLU, ...); null: none.")


class Equalization(Section):
    """Cross-layer equalization of the prepared model (recipe ``equalization``)."""

    pairs: list[EqualizedPair] = Field(description="Layer pairs rescaled channel by channel.")
    sweeps: int
    max_log_scale: float = Field(
        description="The largest |ln s| of the composed per-channel scales: how far the model was from equalized."
    )


class SmoothedGroup(Section):
    input: str = Field(description="The activation divided channel by channel.")
    layers: list[str] = Field(description="The nodes reading it, whose weights take the factors.")
    division: Literal["Mul inserted", "absorbed into its producer"]


class SmoothQuantOutcome(Section):
    """SmoothQuant of the prepared model (recipe ``smoothquant``)."""

    alpha: float | None = Field(
        description="The migration strength kept; null: no alpha beat the unsmoothed model, or no group had outliers."
    )
    scores_db: dict[str, float | None] = Field(
        description="Each candidate's worst float output SQNR in dB, quantized as exact Q/DQ: key 'unsmoothed' or "
        "the alpha; null: the outputs matched exactly."
    )
    scored_on_samples: int
    held_out: bool = Field(
        description="Whether those calibration samples were held out of the candidates' calibration (too few "
        "samples to split: scored on the ones calibrated on)."
    )
    best_alpha_gain_db: PairedDifference | None = Field(
        description="The best-scored alpha's SQNR minus the unsmoothed model's; it is kept only when the interval "
        "lies above 0. Null: no alpha was scored (no group had outliers)."
    )
    outlier_ratios: dict[str, float | None] = Field(
        description="Each activation with outlier channels: its largest channel maximum over the median one "
        "(null: a median of 0)."
    )
    smoothed: list[SmoothedGroup]


class NodeDecision(Section):
    node: str
    decision: Literal["quantized", "pass_through", "float", "excluded"]
    reason: str


class AnnotationSummary(Section):
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


class PercentileCandidate(Section):
    clip: Literal["percentile", "mse"] = "percentile"
    percentile: float | None = Field(description="The candidate's percentile (null: the MSE threshold).")
    sqnr_db: float | None = Field(description="Worst output SQNR on the search samples (null: exact, or not finite).")


class PercentileSearch(Section):
    chosen: float = Field(description="The percentile the run went on with (with clip mse: the configured one).")
    clip: Literal["percentile", "mse"] = Field("percentile", description="The kind of candidate kept.")
    samples: int
    candidates: list[PercentileCandidate]


class CalibrationSummary(Section):
    num_samples: int
    batch_size: int
    num_batches: int
    percentile_search: PercentileSearch | None = Field(
        None,
        description="The clipping percentile, or MSE threshold, kept among the candidates (null: no search ran: "
        "observer not percentile, no candidates, or fewer than 64 calibration samples).",
    )


# ---- evaluate ----


class OutputMetrics(Section):
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


class ModelSizes(Section):
    fp32_bytes: int
    qdq_bytes: int
    quantize_linear_nodes: int = Field(description="QuantizeLinear and DynamicQuantizeLinear nodes.")
    dequantize_linear_nodes: int


class TaskScores(Section):
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


class Evaluation(Section):
    model: ModelSizes
    num_samples: int
    batch_size: int
    top1_output: str | None
    fp32: TaskScores
    qdq_exact: ModeResult
    qdq_deployed: DeployedResult
    latency_ms_per_sample: dict[str, float | None]
    deployed_vs_exact: dict[str, OutputMetrics]


class Parity(Section):
    agree: bool | None
    min_sqnr_db: float | None
    top1_gap: float | None
    tolerance: dict[str, float]
    reason: str
    remedy: str | None
    before_remedy: dict[str, Any] | None


# ---- analyze ----


class GraphwiseBounds(Section):
    samples: int
    runs_per_batch: int
    batch_size: int | None = Field(None, description="Samples a run took.")


class LayerwiseBounds(Section):
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


class LayerHarm(Section):
    rank: int = Field(description="1 = the most harmful layer.")
    node: str
    op_type: str
    tensors: list[str] = Field(description="The quantized tensors the node reads.")
    sqnr_db: float | None = Field(description="Worst output SQNR to FP32 with only this layer quantized.")
    cosine: float | None
    nonfinite: bool
    analyzed: bool = Field(description="False when the layer-wise run was skipped (max_layers).")
    local_sqnr_db: float | None


class TensorStats(Section):
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


class Analysis(Section):
    graphwise: GraphwiseBounds
    layerwise: LayerwiseBounds
    layers: list[LayerHarm] = Field(description="Ranked by harm, most harmful first.")
    tensors: list[TensorStats]


# ---- reconstruction ----


class ReconstructedBlock(Section):
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
    device: str = Field(description="The torch device it trained on (cpu or cuda: the run's device, auto resolved).")
    blocks: list[ReconstructedBlock]


# ---- qat ----


class QatEpoch(Section):
    epoch: int
    steps: int
    loss: float = Field(description="Mean distillation loss over the epoch's steps.")
    heldout_sqnr_db: float | None = Field(description="Held-out SQNR after the epoch; null where infinite.")


class QatSqnr(Section):
    before: float | None = Field(description="Of the post-training model.")
    after: float | None = Field(description="Of the model kept (the post-training one unless status is trained).")


class Qat(QatConfig):
    device: str = Field(description="The torch device it trained on (cpu or cuda: the run's device, auto resolved).")
    status: Literal["trained", "kept_ptq", "skipped", "diverged"] = Field(
        description="kept_ptq: no epoch beat the post-training model on the held-out samples; skipped: nothing "
        "trained (reason); diverged: a non-finite loss stopped training and the post-training model was kept."
    )
    reason: str | None
    num_train: int
    num_heldout: int
    outputs: dict[str, Literal["probabilities", "scores", "values"]] = Field(
        description="The outputs distilled and their kind (the loss kl treats probabilities and scores)."
    )
    heldout_sqnr_db: QatSqnr = Field(description="SQNR of the outputs against FP32 on the held-out samples.")
    best_epoch: int = Field(description="The epoch whose parameters were kept; 0: the post-training model.")
    curve: list[QatEpoch] = Field(description="The loss curve, one point per epoch.")
    resumed_from: int | None = Field(
        None, description="The step training went on from, resumed from an earlier attempt's checkpoint; null: none."
    )
    seconds: float


# ---- dataset split (written by the service) ----


class SplitPart(Section):
    count: int
    sha256: str


class DatasetSplit(Section):
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


class LatencyStats(Section):
    batch: int
    runs: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    throughput_samples_per_s: float | None


class CpuLatency(Section):
    device: str
    provider: str
    onnxruntime: str
    threads: int | None
    cpu_count: int | None = Field(title="CPU count")
    warmup: int
    runs: int
    budget_s: float | None = Field(
        None,
        description="Seconds of timed rounds per batch size after which the rounds stop (runs is then a maximum). "
        "Each round runs FP32 and the quantized model once, the order rotated, so that load from other processes "
        "falls on both alike.",
    )
    session_config: dict[str, str] = Field(
        default_factory=dict,
        description="ONNX Runtime session config entries of every session measured: intra-op spinning off, since "
        "an idle session's spinning threads take the cores from the one running (a lone session with spinning on "
        "runs faster at batch 1).",
    )
    batch_sizes: list[int]
    fp32: dict[str, LatencyStats]
    quantized: dict[str, LatencyStats]
    speedup_p50: dict[str, float | None]
    notes: list[str]


class AlternativeTimings(Section):
    fp32: PlacementTiming | None = Field(title="FP32", description="The prepared model; null: refused.")
    default: PlacementTiming | None = Field(description="The model kept (its Q/DQ as ONNX Runtime runs them).")
    onnxruntime: PlacementTiming | None = Field(description="The onnxruntime platform's model.")


class CpuAlternative(Section):
    """The onnxruntime platform measured beside a tensorrt model no engine was built for
    (``quantcore.pipeline.cpu_alternative``)."""

    platform: Literal["onnxruntime"]
    why: str = Field(description="Why it was measured: the engine stage's reason and the unnamed platform.")
    objective: str = Field(description="How it was quantized: every region its rules quantize, no placement.")
    threads: int = Field(description="ONNX Runtime intra-op threads of every measurement.")
    batch_sizes: list[int]
    timings: dict[str, AlternativeTimings] = Field(description="Per batch size (batch_1, ...), timed interleaved.")
    speedup_p50: dict[str, dict[str, float | None]] = Field(
        description="default and onnxruntime: per batch size, FP32 p50 / the model's p50."
    )
    output: str | None = Field(description="The output whose cosine is given: the top-1 output, else the first.")
    cosine: dict[str, float | None] = Field(
        description="default and onnxruntime: that output's cosine to FP32, as deployed on the CPU EP."
    )


class Latency(Section):
    cpu: CpuLatency | None = Field(title="CPU latency")
    cpu_alternative: CpuAlternative | None = Field(
        None,
        title="CPU alternative",
        description="A tensorrt model no engine was built for, whose recipe named no platform: the onnxruntime "
        "platform measured beside it. null: not measured.",
    )


class EngineSummary(Section):
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


class WeightOnlyLayer(Section):
    node: str
    op_type: Literal["MatMul", "Gemm", "Gather"] = Field(
        description="Gather: an embedding table (quantize_embeddings), rounded to nearest (hqq: HQQ's fit) in "
        "blocks along each row."
    )
    weight: str = Field(description="The FP32 initializer replaced by the stored codes.")
    shape: list[int] = Field(description="[K, N]: the reduction axis first (an embedding: [row length, rows]).")
    fp32_bytes: int
    stored_bytes: int = Field(description="Packed codes, scales and zero points of this layer.")
    output_error: float | None = Field(
        None,
        description="gptq, awq: ||XW - XŴ||² / ||XW||² on the calibration data (X the layer's input; "
        "gptq: as computed with the earlier segments' weights already quantized), of the weight the layer "
        "computes with (awq: its stored weight divided back by the channel scales).",
    )
    rtn_output_error: float | None = Field(None, description="gptq, awq: the same of round-to-nearest, for comparison.")
    damping: float | None = Field(None, description="gptq: the damping used (raised x10 when H was not definite).")
    awq_alpha: float | None = Field(
        None, description="awq: the exponent chosen for this layer's group (0: its weights kept round-to-nearest)."
    )


class WeightOnlyFloatLayer(Section):
    node: str
    op_type: str
    weight: str
    reason: str = Field(description="Why it stays float (LM head, embedding, tied weight, shape).")


class WeightOnlySize(Section):
    fp32_model_bytes: int
    model_bytes: int = Field(description="The exported model's file(s).")
    quantized_layers_fp32_bytes: int
    quantized_layers_bytes: int
    quantized_layers_ratio: float | None = Field(description="quantized_layers_bytes / quantized_layers_fp32_bytes.")


class NextTokenScores(Section):
    perplexity: float | None = Field(description="exp of the mean next-token negative log-likelihood (nats).")
    next_token_accuracy: float | None = Field(description="Fraction of positions whose argmax is the next token.")


class LanguageModelMetrics(Section):
    fp32: NextTokenScores
    quantized: NextTokenScores = Field(description="The exported model as deployed (ONNX Runtime, all fusions).")
    positions: int = Field(description="Positions scored: every t < T-1 (where attention_mask marks t and t+1).")
    perplexity_increase: float | None = Field(description="quantized perplexity / FP32 perplexity - 1.")


class WeightOnlySection(WeightOnlyConfig):
    bits: Literal[4, 8]
    layers: list[WeightOnlyLayer] = Field(description="The layers quantized, in graph order.")
    kept_float: list[WeightOnlyFloatLayer] = Field(description="MatMul/Gemm/Gather with a weight kept float, and why.")
    size: WeightOnlySize
    next_token_agreement: dict[str, float] = Field(
        description="Per output of rank >= 3 (batch, positions, vocabulary): the fraction of positions whose "
        "argmax (the next token) the deployed model shares with FP32."
    )
    language_model: LanguageModelMetrics | None = Field(
        None,
        description="Causal LMs (output logits (batch, positions, vocabulary), tokens as input_ids or the only "
        "2-D integer input): perplexity and next-token accuracy on the evaluation data; null for other models.",
    )
    notes: list[str] = Field(description="What the deployed model computes beyond the stored weights.")


class Report(Section):
    """A job's report.json."""

    format: str
    config: RunConfig
    prepare: Preparation
    annotation: AnnotationSummary
    calibration: CalibrationSummary
    reconstruction: Reconstruction | None = Field(None, description="Null without reconstruction in the recipe.")
    qat: Qat | None = Field(None, description="Null without qat in the recipe.")
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
    mixed_precision: MixedPrecisionOutcome | None = Field(None, description="Null without recipe mixed_precision.")
    weight_only: WeightOnlySection | None = Field(
        None, description="Platform onnxruntime-weight-only: options, layers quantized and kept float, sizes."
    )
    dataset: DatasetSplit | None = Field(
        None, description="The seeded calibration/evaluation split (recorded by the service, not by quantcore)."
    )
