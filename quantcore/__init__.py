"""quantcore: FP32 ONNX in, quantized QDQ ONNX out (INT8, FP8, 2-8 bit), with an honest report of
what it cost, measured on the exported model both as exact Q/DQ and as deployed on ONNX Runtime.

One call does everything::

    config = QuantizeConfig(platform="onnxruntime", precision="int8", observer="percentile",
                            overrides=(NodeOverride("/head/*", observer="minmax"),))
    result = quantcore.quantize("model.onnx", calibration, evaluation, config, "out/",
                                labels=labels, progress=print, should_cancel=lambda: False)

Platforms (``PLATFORMS``): tensorrt, tensorrt-fp8, onnxruntime, onnxruntime-dynamic, academic.

or compose the stages::

    prepared = prepare("model.onnx")
    annotation = annotate(prepared, config)
    annotation = calibrate(prepared, annotation, calibration, config)
    result = reconstruct(prepared, annotation, calibration, config)   # optional: AdaRound/BRECQ/QDrop
    prepared, annotation = result.prepared, result.annotation
    result = qat(prepared, annotation, calibration, config)           # optional: QAT (``QatConfig``)
    prepared, annotation = result.prepared, result.annotation
    exported = export(prepared, annotation, "out/")
    report = evaluate("model.onnx", exported.model_path, evaluation, config)

Where the error comes from: ``analyze(prepared, calibrated, evaluation, config)`` ranks the layers by
harm (``AnalysisOptions`` bounds it); ``QuantizeConfig(target=AccuracyTarget("cosine", 0.999))`` keeps
the most harmful layers in float until the target is met; ``QuantizeConfig(mixed_precision=MixedPrecisionConfig())``
promotes the most harmful layers to 16 bits (or float, where the platform takes no 16-bit tensors) until an
objective is met on the calibration data; ``QuantizeConfig(strategy="auto")`` with
``quantize_auto`` (same arguments as ``quantize``) tries variations of the config and keeps the best
(``AutoOptions``: budget, objective, candidates); ``render_html(report)`` is the report as a
standalone page.

Deployment: ``build_engine`` (TensorRT, GPU workers; ``skipped`` with the reason elsewhere),
``check_qdq`` (TensorRT's explicit-quantization rules, anywhere), ``cpu_latency`` (ONNX Runtime).
Upload validation: ``inspect_model(path, min_opset=..., max_opset=...)``. Errors: ``quantcore.errors``.
"""

from quantcore.analysis.ranking import analyze
from quantcore.annotate.annotation import Annotation, annotate
from quantcore.annotate.platforms import PLATFORMS, Platform
from quantcore.auto import quantize_auto
from quantcore.calibrate.calibration import calibrate
from quantcore.config import (
    AccuracyTarget,
    AnalysisOptions,
    AutoOptions,
    MixedPrecisionConfig,
    NodeOverride,
    QatConfig,
    QuantizeConfig,
    ReconstructionConfig,
)
from quantcore.errors import (
    Canceled,
    InvalidDataError,
    InvalidModelError,
    QuantcoreError,
    UnsupportedModelError,
)
from quantcore.evaluate.evaluation import evaluate
from quantcore.evaluate.parity import ParityVerdict, check_parity
from quantcore.export.qdq import ExportResult, export
from quantcore.numerics.fake_quant import fake_quantize_tensor
from quantcore.numerics.policy import QuantPolicy, RoundingPolicy
from quantcore.numerics.storage_type import StorageType, storage_type
from quantcore.numerics.tqc import QuantState, TensorQuantConfig
from quantcore.pipeline import STAGES, QuantizeResult, quantize
from quantcore.prepare.preparation import PreparedModel, prepare
from quantcore.prepare.validate import inspect_model
from quantcore.qat import QatResult, qat
from quantcore.reconstruction import ReconstructionResult, reconstruct
from quantcore.report.html import render_html
from quantcore.tensorrt.engine import build_engine, check_qdq, cpu_latency

__all__ = [
    "PLATFORMS",
    "STAGES",
    "AccuracyTarget",
    "AnalysisOptions",
    "Annotation",
    "AutoOptions",
    "Canceled",
    "ExportResult",
    "InvalidDataError",
    "InvalidModelError",
    "MixedPrecisionConfig",
    "NodeOverride",
    "ParityVerdict",
    "Platform",
    "PreparedModel",
    "QatConfig",
    "QatResult",
    "QuantPolicy",
    "QuantState",
    "QuantcoreError",
    "QuantizeConfig",
    "QuantizeResult",
    "ReconstructionConfig",
    "ReconstructionResult",
    "RoundingPolicy",
    "StorageType",
    "TensorQuantConfig",
    "UnsupportedModelError",
    "analyze",
    "annotate",
    "build_engine",
    "calibrate",
    "check_parity",
    "check_qdq",
    "cpu_latency",
    "evaluate",
    "export",
    "fake_quantize_tensor",
    "inspect_model",
    "prepare",
    "qat",
    "quantize",
    "quantize_auto",
    "reconstruct",
    "render_html",
    "storage_type",
]
