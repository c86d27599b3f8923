"""Stage 1, prepare: load the user's ONNX model and make it ready to annotate.

Steps, in order (each keeps every graph input/output name, dtype and dynamic dimension):

1. load, external data included (``InvalidModelError`` if the file can't be parsed);
2. refuse models that are already quantized (``UnsupportedModelError``);
3. opset < 13 → upgraded to 13 with ``onnx.version_converter`` (per-channel QuantizeLinear needs the
   ``axis`` attribute of opset 13); a failed conversion is an ``UnsupportedModelError``;
4. give unnamed nodes a name (exclusion patterns and reports speak node names);
5. fold constant subexpressions and BatchNormalization into Conv/ConvTranspose/Gemm
   (``quantcore.folding``);
6. infer shapes; a failure is tolerated and recorded in ``warnings``.

The exported QDQ model is this prepared graph plus Q/DQ nodes, so BN stays folded in it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import shape_inference, version_converter
from onnx.external_data_helper import load_external_data_for_model

from quantcore.errors import InvalidModelError, UnsupportedModelError
from quantcore.folding import FoldedBatchNorm, fold_batchnorms, fold_constants
from quantcore.graph import default_opset, ensure_node_names, external_locations
from quantcore.validate import check_external_data

MIN_QDQ_OPSET = 13  # QuantizeLinear/DequantizeLinear gained the per-channel ``axis`` attribute in opset 13
MIN_QDQ_IR_VERSION = 7  # the IR version that opset 13 requires
QUANTIZED_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "QLinearConv",
        "QLinearMatMul",
        "ConvInteger",
        "MatMulInteger",
        "DynamicQuantizeLinear",
    }
)


@dataclass(frozen=True)
class PreparedModel:
    """A loaded, simplified model ready for annotation. ``model`` is owned by this object; later stages
    read it and never leave it changed (export edits a copy)."""

    model: onnx.ModelProto
    source_path: Path | None
    source_opset: int
    folded_batchnorms: tuple[FoldedBatchNorm, ...]
    folded_constants: int
    renamed_nodes: int
    warnings: tuple[str, ...]

    @property
    def opset(self) -> int:
        return default_opset(self.model) or MIN_QDQ_OPSET


def load_model(path: str | Path) -> onnx.ModelProto:
    """Parse an ONNX file with its external data; unreadable files raise ``InvalidModelError``.

    External-data locations are checked (``quantcore.validate.check_external_data``) before any is
    read, so a model can't make us read files outside its own directory.
    """
    path = Path(path)
    if not path.is_file():
        raise InvalidModelError(f"model file not found: {path}")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as error:  # protobuf DecodeError on garbage or truncated files
        raise InvalidModelError(f"cannot load {path.name} as ONNX: {error}") from error
    if not external_locations(model):
        return model
    check_external_data(model, path.parent)
    try:
        load_external_data_for_model(model, str(path.parent))
        return model
    except Exception as error:  # OSError and friends while reading the data files
        raise InvalidModelError(f"cannot read the external data of {path.name}: {error}") from error


def upgrade_opset(model: onnx.ModelProto, target: int = MIN_QDQ_OPSET) -> onnx.ModelProto:
    """``model`` converted to default-domain opset ``target`` (returned unchanged when already ≥ target)."""
    current = default_opset(model)
    if current is None:
        raise InvalidModelError("model does not import the default ONNX operator set")
    if current >= target:
        return model
    try:
        converted = version_converter.convert_version(model, target)
        converted.ir_version = max(converted.ir_version, MIN_QDQ_IR_VERSION)
        onnx.checker.check_model(converted)
    except Exception as error:  # the converter raises assorted C++ errors
        raise UnsupportedModelError(
            f"the model uses opset {current}; quantization needs opset >= {target} and the automatic "
            f"conversion failed: {str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__}"
            f". Re-export the model with opset >= {target}."
        ) from error
    return converted


def prepare(model: str | Path | onnx.ModelProto) -> PreparedModel:
    """Load (if given a path) and prepare a model; see the module docstring for the steps."""
    source_path = None
    if isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
    else:
        source_path = Path(model)
        proto = load_model(source_path)

    quantized = sorted({n.op_type for n in proto.graph.node if n.op_type in QUANTIZED_OPS})
    if quantized:
        raise UnsupportedModelError(f"the model is already quantized (it contains {', '.join(quantized)})")
    source_opset = default_opset(proto)
    if source_opset is None:
        raise InvalidModelError("model does not import the default ONNX operator set")
    warnings: list[str] = []
    if source_opset < MIN_QDQ_OPSET:
        proto = upgrade_opset(proto)
        warnings.append(f"opset upgraded from {source_opset} to {MIN_QDQ_OPSET} for per-channel Q/DQ")

    renamed = ensure_node_names(proto.graph)
    folded_constants = fold_constants(proto)
    folded = fold_batchnorms(proto)
    try:
        proto = shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=True)
    except Exception as error:  # shape inference is an optimisation, not a requirement
        warnings.append(f"shape inference failed, continuing without it: {str(error).strip()[:300]}")
    return PreparedModel(
        model=proto,
        source_path=source_path,
        source_opset=source_opset,
        folded_batchnorms=tuple(folded),
        folded_constants=folded_constants,
        renamed_nodes=renamed,
        warnings=tuple(warnings),
    )
