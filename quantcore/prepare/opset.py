"""Operator-set and IR-version normalisation: what converters emit vs what quantization and the
runtime need.

- opset < 13 → converted to 13 with ``onnx.version_converter``: QuantizeLinear/DequantizeLinear
  gained the per-channel ``axis`` attribute in opset 13.
- IR version > what ONNX Runtime loads (``onnx.helper`` of onnx 1.23 stamps IR 14, ONNX Runtime 1.31
  reads up to 13) → lowered to ``MAX_RUNTIME_IR_VERSION``, but never below what the imported opsets
  need (``onnx.helper.VERSION_TABLE``: the IR of the first ONNX release with that opset); a model
  whose opset itself needs a newer IR than the runtime reads is left alone (the runtime says so).
"""

from __future__ import annotations

import onnx
from onnx import version_converter

from quantcore.errors import InvalidModelError, UnsupportedModelError
from quantcore.graph.index import default_opset

MIN_QDQ_OPSET = 13  # QuantizeLinear/DequantizeLinear gained the per-channel ``axis`` attribute in opset 13
MIN_QDQ_IR_VERSION = 7  # the IR version that opset 13 requires
MAX_RUNTIME_IR_VERSION = 13  # the newest IR version ONNX Runtime 1.31's loader accepts (14 fails)


def required_ir_version(model: onnx.ModelProto) -> int:
    """The smallest IR version allowed by every default-domain opset the model imports
    (the ``onnx.helper.VERSION_TABLE`` row of the first ONNX release with that opset)."""
    needed = 3
    for opset in model.opset_import:
        if opset.domain not in ("", "ai.onnx"):
            continue
        rows = [row for row in onnx.helper.VERSION_TABLE if row[2] >= opset.version]
        if rows:
            needed = max(needed, min(row[1] for row in rows))
    return needed


def lower_ir_version(model: onnx.ModelProto, limit: int = MAX_RUNTIME_IR_VERSION) -> int | None:
    """Lower ``model.ir_version`` to ``limit`` when it is newer and the opsets allow it; returns the
    old version when it changed, None otherwise. Mutates ``model``."""
    if model.ir_version <= limit:
        return None
    target = max(required_ir_version(model), min(limit, model.ir_version))
    if target >= model.ir_version:
        return None
    old = int(model.ir_version)
    model.ir_version = target
    return old


def upgrade_opset(model: onnx.ModelProto, target: int = MIN_QDQ_OPSET) -> onnx.ModelProto:
    """``model`` converted to default-domain opset ``target`` (returned unchanged when already ≥ target).

    Raises ``UnsupportedModelError`` when the converter fails (it lacks adapters for a few ops).
    """
    current = default_opset(model)
    if current is None:
        raise InvalidModelError("model does not import the default ONNX operator set")
    if current >= target:
        return model
    try:
        converted = version_converter.convert_version(model, target)
        converted.ir_version = max(converted.ir_version, MIN_QDQ_IR_VERSION)
        lower_ir_version(converted)
        onnx.checker.check_model(converted)
    except Exception as error:  # the converter raises assorted C++ errors
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UnsupportedModelError(
            f"the model uses opset {current}; quantization needs opset >= {target} and the automatic "
            f"conversion failed: {reason}. Re-export the model with opset >= {target}."
        ) from error
    return converted
