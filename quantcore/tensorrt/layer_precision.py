"""Per-layer precision of a built engine, from the engine inspector's JSON, checked against the
layers the QDQ model annotated as INT8.

The inspector (``ProfilingVerbosity.DETAILED``) lists each engine layer with its ``Name`` (fused
layers join the ONNX node names with " + "), ``LayerType``, ``Inputs``/``Outputs`` whose
``Format/Datatype`` reads like "Channel major INT8 format where channel % 32 == 0" or "Row major linear
FP32", and, in TensorRT 10, ``Metadata`` naming its ONNX nodes ("[ONNX Layer: conv1]"). A layer's
precision is the lowest-precision type among its inputs (what its kernel reads): INT8 < FP8 < FP16 <
BF16 < FP32. An ONNX node *annotated INT8* (a Conv/ConvTranspose/Gemm/MatMul all of whose inputs come
from DequantizeLinear of int8) whose engine layer reads no INT8 input ran in higher precision — the
report says so. Matching layers to nodes by name is a heuristic: TensorRT may rename or split layers,
so an annotated node found in no layer is reported as "not found", never as a success.
"""

from __future__ import annotations

import json
import re
from typing import Any

import onnx
from onnx import TensorProto

from quantcore.tensorrt.qdq_rules import WEIGHTED_OPS, QdqGraph

ORDER = ("INT4", "INT8", "FP8", "FP16", "BF16", "FP32")
PATTERNS = {  # token in a Format/Datatype string -> precision
    "INT4": re.compile(r"\bint4\b", re.I),
    "INT8": re.compile(r"\bint8\b", re.I),
    "FP8": re.compile(r"\bfp8\b|\bfloat8", re.I),
    "FP16": re.compile(r"\bfp16\b|\bhalf\b", re.I),
    "BF16": re.compile(r"\bbf16\b", re.I),
    "FP32": re.compile(r"\bfp32\b|\bfloat\b", re.I),
}
ONNX_LAYER = re.compile(r"\[ONNX Layer: ([^\]]+)\]")


def int8_annotated_nodes(model: onnx.ModelProto) -> list[str]:
    """Weighted nodes whose data and weight inputs both come from an int8 DequantizeLinear."""
    graph = QdqGraph(model)
    names = []
    for node in model.graph.node:
        if node.op_type not in WEIGHTED_OPS or len(node.input) < 2:
            continue
        sources = [graph.dequantized_by(name) for name in node.input[:2]]
        if all(dq is not None and graph.quant_type(dq) == TensorProto.INT8 for dq in sources):
            names.append(node.name)
    return names


def precision_of(formats: list[str]) -> str | None:
    found = [p for p in ORDER if any(PATTERNS[p].search(f) for f in formats)]
    return found[0] if found else None


def _formats(tensors: Any) -> list[str]:
    return [str(t.get("Format/Datatype", "")) for t in tensors or [] if isinstance(t, dict)]


def layer_table(inspector_json: str, annotated: list[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """(layers, notes): one record per engine layer ``{name, type, onnx_nodes, input_precision,
    output_precision, annotated_int8}`` and a note per annotated node that did not run in INT8."""
    document = json.loads(inspector_json)
    layers = []
    for raw in document.get("Layers", []):
        if isinstance(raw, str):  # verbosity below DETAILED: names only
            raw = {"Name": raw}
        name = str(raw.get("Name", ""))
        metadata = str(raw.get("Metadata", ""))
        nodes = ONNX_LAYER.findall(metadata) or [part.strip() for part in name.split(" + ") if part.strip()]
        layers.append(
            {
                "name": name,
                "type": raw.get("LayerType"),
                "onnx_nodes": nodes,
                "input_precision": precision_of(_formats(raw.get("Inputs"))),
                "output_precision": precision_of(_formats(raw.get("Outputs"))),
                "annotated_int8": any(node in annotated for node in nodes),
            }
        )
    notes = []
    for node in annotated:
        hosts = [layer for layer in layers if node in layer["onnx_nodes"]]
        if not hosts:
            notes.append(f"{node}: annotated INT8, not found among the engine's layers (renamed or fused away)")
            continue
        precisions = {layer["input_precision"] for layer in hosts}
        if "INT8" not in precisions:
            shown = ", ".join(sorted(str(p) for p in precisions))
            notes.append(f"{node}: annotated INT8 but TensorRT ran it in {shown}")
    return layers, notes
