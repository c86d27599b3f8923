"""The names a run chooses among: platforms and the precisions each accepts, observers' clips, devices,
reconstruction methods, strategies and their candidates, CPU objectives; each a tuple a field is checked
against (the recipe in ``jobs`` keeps copies, pinned to these by tests)."""

from __future__ import annotations

from typing import Literal, get_args

from quantcore.numerics.precision import parse_precision

# The platforms a run may name: the keys of ``quantcore.annotate.platforms.PLATFORMS``, whose rule sets sit
# above config (they read it); a test pins the two together.
PlatformName = Literal[
    "tensorrt", "tensorrt-fp8", "onnxruntime", "onnxruntime-dynamic", "onnxruntime-weight-only", "academic"
]
PLATFORM_NAMES: tuple[PlatformName, ...] = get_args(PlatformName)
# platform -> the precisions it accepts, its default first; None: int8 and any integer wXaY. Here, not in
# the platforms' rule sets, so that a run's precision is checked and defaulted with its other options.
PLATFORM_PRECISIONS: dict[PlatformName, tuple[str, ...] | None] = {
    "tensorrt": ("int8", "w8a8"),
    "tensorrt-fp8": ("fp8",),
    "onnxruntime": ("int8", "w8a8"),
    "onnxruntime-dynamic": ("int8", "w8a8"),  # DynamicQuantizeLinear is uint8 only
    "onnxruntime-weight-only": ("w4", "w8"),  # activations stay float (``WeightOnlyConfig``)
    "academic": None,
}
WEIGHT_ONLY_PLATFORM: PlatformName = "onnxruntime-weight-only"
WEIGHT_ONLY_ALGORITHMS = ("rtn", "gptq", "awq", "hqq")
WEIGHT_ONLY_FORMATS = ("matmulnbits", "dequantize_linear")
WEIGHT_ONLY_BLOCK_SIZES = (16, 256)  # a power of two in this range
DEVICES = ("cpu", "cuda", "auto")  # quantcore.runtime.device
CLIPS = ("percentile", "mse")  # where a percentile-observed tensor is clipped (QuantizeConfig.clip)
RECONSTRUCTION_METHODS = ("adaround", "brecq", "qdrop")
QAT_LOSSES = ("mse", "kl")  # distillation losses of ``quantcore.qat`` (``QatConfig.loss``)
MAX_RECONSTRUCTION_ITERS = 100_000
# fixed: the run quantizes with the config as given (``quantcore.quantize``); auto: a search tries variations
# of it and keeps the best (``quantcore.auto.quantize_auto``, settings ``AutoOptions``).
STRATEGIES = ("fixed", "auto")
# The candidates the auto search may try, cheapest first: the names of ``quantcore.auto.candidates.CANDIDATES``,
# which sit above config (they build configs); a test pins the two together.
AUTO_CANDIDATES = (
    "as_given",
    "full_weights",
    "minmax",
    "mse",
    "kl",
    "floating",
    "equalization",
    "bias_correction",
    "smoothquant",
    "mixed_precision",
    "adaround",
)
AUTO_BUDGET_SECONDS = (10.0, 86_400.0)
# platform -> what mixed precision makes of a sensitive layer (``quantcore.analysis.mixed_precision``): "int16",
# its activations and weights quantized to 16 bits (int16/uint16 Q/DQ at opset 21: ONNX Runtime's CPU EP runs
# them, the layer itself in float between them); "float", the layer left un-quantized, float32 in the exported
# graph (TensorRT takes no 16-bit activations; DynamicQuantizeLinear is uint8 only). Weight-only has none.
MIXED_PRECISION_FORMS: dict[PlatformName, str] = {
    "tensorrt": "float",
    "tensorrt-fp8": "float",
    "onnxruntime": "int16",
    "onnxruntime-dynamic": "float",
    "academic": "int16",
}
WIDE_BITS = 16  # the width of a promoted tensor (``QuantizeConfig.wide_tensors``)
MIXED_PRECISION_FRACTION = (0.0, 0.5)  # max_fraction's bounds, the lower one excluded
MIXED_PRECISION_METRICS = ("cosine", "sqnr")  # measured on calibration samples: no labels for top1_drop
# What the onnxruntime platform's deployment favours (``QuantizeConfig.cpu_objective``): latency places
# quantized regions by measured speed (``quantcore.analysis.placement``); accuracy and size keep every
# region the rules quantize (no placement: the export is that of a run without the option).
CPU_OBJECTIVES = ("accuracy", "latency", "size")
MAX_CPU_BATCH = 4096
# the placement's timing runs as a multiple of the calibration's seconds: from a tenth to a hundred
MIN_TIMING_SHARE, MAX_TIMING_SHARE = 0.1, 100.0


def default_precision(platform: PlatformName) -> str:
    """The precision a run gets when it names none: the platform's first, int8 where it takes any."""
    accepted = PLATFORM_PRECISIONS[platform]
    return accepted[0] if accepted else "int8"


def accepts_precision(platform: PlatformName, precision: str) -> bool:
    """Whether ``platform`` runs ``precision`` (a valid precision name, see ``PLATFORM_PRECISIONS``)."""
    accepted = PLATFORM_PRECISIONS[platform]
    if accepted is None:
        spec = parse_precision(precision)
        return not (spec.floating or spec.weight_only)
    return precision in accepted
