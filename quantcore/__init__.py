"""quantcore: FP32 ONNX in, INT8 QDQ ONNX out, with an honest report of what it cost.

One call does everything::

    result = quantcore.quantize("model.onnx", calibration, evaluation, QuantizeConfig(), "out/")

or compose the stages::

    prepared = prepare("model.onnx")
    annotation = annotate(prepared, config)
    annotation = calibrate(prepared, annotation, calibration, config)
    exported = export(prepared, annotation, "out/")
    report = evaluate("model.onnx", exported.model_path, evaluation, config)

Upload validation: ``inspect_model(path, min_opset=..., max_opset=...)``. Errors: ``quantcore.errors``.
"""

from quantcore.annotation import Annotation, annotate
from quantcore.calibration import calibrate
from quantcore.config import QuantizeConfig
from quantcore.errors import (
    Canceled,
    InvalidDataError,
    InvalidModelError,
    QuantcoreError,
    UnsupportedModelError,
)
from quantcore.evaluation import evaluate
from quantcore.pipeline import STAGES, QuantizeResult, quantize
from quantcore.preparation import PreparedModel, prepare
from quantcore.qdq import ExportResult, export
from quantcore.tqc import QuantState, TensorQuantConfig
from quantcore.validate import inspect_model

__all__ = [
    "STAGES",
    "Annotation",
    "Canceled",
    "ExportResult",
    "InvalidDataError",
    "InvalidModelError",
    "PreparedModel",
    "QuantState",
    "QuantcoreError",
    "QuantizeConfig",
    "QuantizeResult",
    "TensorQuantConfig",
    "UnsupportedModelError",
    "annotate",
    "calibrate",
    "evaluate",
    "export",
    "inspect_model",
    "prepare",
    "quantize",
]
