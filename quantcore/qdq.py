"""Stage 5, export: the prepared graph (the user's graph with BN folded) plus QuantizeLinear /
DequantizeLinear, and the table of every tensor's quantization.

Activations: tensor t gets one pair ``t → QuantizeLinear → DequantizeLinear → t_dequantized``,
placed right after t's producer; every annotated consumer reads ``t_dequantized``, anything else
(other consumers, graph outputs) still reads float t.

Weights: stored quantized, ``q = clip(round(W / s), -128, 127)`` as an int8 initializer, followed by
DequantizeLinear (``axis`` = the output-channel axis when per-channel). This is TensorRT's
recommended form and ONNX Runtime's CPU EP runs it; the float initializer is removed once nothing
else reads it. Their table state is BAKED.

Graph inputs, outputs, their names and dynamic dimensions, opset imports and metadata are those of
the prepared model. The result is checked with ``onnx.checker.check_model(full_check=True)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantcore import atomic
from quantcore.annotation import Annotation
from quantcore.errors import QuantcoreError, UnsupportedModelError
from quantcore.fake_quant import quantize_array
from quantcore.graph import GraphIndex, NameScope
from quantcore.preparation import PreparedModel
from quantcore.session import PROTOBUF_LIMIT
from quantcore.tqc import QuantState, TensorQuantConfig

MODEL_FILE = "model.qdq.onnx"
TQC_FILE = "tqc.json"
TQC_FORMAT = "quantcore.tqc/1"
INT8_RANGES = {(-128, 127): onnx.TensorProto.INT8, (0, 255): onnx.TensorProto.UINT8}


@dataclass(frozen=True)
class ExportResult:
    model_path: Path
    tqc_path: Path
    files: tuple[Path, ...]  # everything written (model, its external data if any, the table)
    quantize_linear_nodes: int
    dequantize_linear_nodes: int


def _zero_point_type(tqc: TensorQuantConfig, name: str, *, parameter: bool) -> int:
    if tqc.num_bits != 8:
        raise UnsupportedModelError(f"tensor {name!r}: {tqc.num_bits}-bit quantization can't be exported as int8 QDQ")
    if parameter:  # stored codes already respect the range; only the storage type matters
        return onnx.TensorProto.INT8 if tqc.quant_min < 0 else onnx.TensorProto.UINT8
    if (tqc.quant_min, tqc.quant_max) not in INT8_RANGES:
        raise UnsupportedModelError(
            f"tensor {name!r}: quant range [{tqc.quant_min}, {tqc.quant_max}] differs from "
            f"what QuantizeLinear saturates to"
        )
    return INT8_RANGES[(tqc.quant_min, tqc.quant_max)]


def _zero_point(tqc: TensorQuantConfig, elem_type: int, name: str) -> onnx.TensorProto:
    dtype = np.int8 if elem_type == onnx.TensorProto.INT8 else np.uint8
    return numpy_helper.from_array(np.asarray(tqc.offset).astype(dtype), name)


def build_qdq_model(prepared: PreparedModel, annotation: Annotation) -> onnx.ModelProto:
    """A new model: ``prepared.model`` with Q/DQ inserted per the calibrated ``annotation``."""
    for name, tqc in annotation.configs.items():
        if tqc.scale is None:
            raise ValueError(f"tensor {name!r} is not calibrated (state {tqc.state.value}); run calibrate first")
    model = onnx.ModelProto()
    model.CopyFrom(prepared.model)
    graph = model.graph
    index = GraphIndex(graph)
    scope = NameScope(index.used_names())
    nodes_by_name = {node.name: node for node in graph.node}

    head: list[onnx.NodeProto] = []  # weight DQs and Q/DQ of graph inputs, placed before every node
    after: dict[str, list[onnx.NodeProto]] = {}  # producer node name -> Q/DQ of its outputs
    replaced: dict[str, str] = {}  # tensor -> its DequantizeLinear output

    for name, tqc in annotation.configs.items():
        parameter = name in annotation.parameters
        elem_type = _zero_point_type(tqc, name, parameter=parameter)
        scale_name = scope.fresh(f"{name}_scale")
        zero_name = scope.fresh(f"{name}_zero_point")
        graph.initializer.append(numpy_helper.from_array(np.asarray(tqc.scale, dtype=np.float32), scale_name))
        graph.initializer.append(_zero_point(tqc, elem_type, zero_name))
        axis = {"axis": tqc.channel_axis} if tqc.per_channel else {}
        dq_out = scope.fresh(f"{name}_dequantized")
        if parameter:
            codes_name = scope.fresh(f"{name}_quantized")
            graph.initializer.append(numpy_helper.from_array(quantize_array(index.array(name), tqc), codes_name))
            head.append(
                helper.make_node(
                    "DequantizeLinear",
                    [codes_name, scale_name, zero_name],
                    [dq_out],
                    name=scope.fresh(f"{name}_DequantizeLinear"),
                    **axis,
                )
            )
        else:
            q_out = scope.fresh(f"{name}_quantized")
            pair = [
                helper.make_node(
                    "QuantizeLinear",
                    [name, scale_name, zero_name],
                    [q_out],
                    name=scope.fresh(f"{name}_QuantizeLinear"),
                    **axis,
                ),
                helper.make_node(
                    "DequantizeLinear",
                    [q_out, scale_name, zero_name],
                    [dq_out],
                    name=scope.fresh(f"{name}_DequantizeLinear"),
                    **axis,
                ),
            ]
            producer = index.producers.get(name)
            if producer is None:
                head.extend(pair)
            else:
                after.setdefault(producer.name, []).extend(pair)
        replaced[name] = dq_out
        for use in annotation.consumers[name]:
            node = nodes_by_name[use.node]
            if node.input[use.index] != name:
                raise ValueError(
                    f"annotation says {use.node} input {use.index} reads {name!r}, the graph says "
                    f"{node.input[use.index]!r}"
                )
            node.input[use.index] = dq_out

    ordered = list(head)
    for node in graph.node:
        ordered.append(node)
        ordered.extend(after.get(node.name, []))
    del graph.node[:]
    graph.node.extend(ordered)

    # Float weights nobody reads any more are dropped (their int8 codes replace them).
    still_read = GraphIndex(graph).consumers
    keep = {i.name for i in graph.input} | {o.name for o in graph.output}
    for tensor in [t for t in graph.initializer if t.name in annotation.parameters]:
        if tensor.name not in keep and not still_read.get(tensor.name):
            graph.initializer.remove(tensor)
    return model


def tqc_table(annotation: Annotation, *, platform: str | None = None) -> dict[str, Any]:
    """The JSON table of every quantized tensor: its config (bits, scale(s), offset, axis, observer,
    state), whether it is a weight, and the node inputs reading its quantized value."""
    tensors = {}
    for name, tqc in annotation.configs.items():
        parameter = name in annotation.parameters
        if parameter and tqc.state is QuantState.ACTIVATED:
            tqc = tqc.with_state(QuantState.BAKED)
        entry = tqc.to_dict()
        entry["kind"] = "weight" if parameter else "activation"
        entry["consumers"] = [{"node": use.node, "input": use.index} for use in annotation.consumers[name]]
        tensors[name] = entry
    return {"format": TQC_FORMAT, "platform": platform, "tensors": tensors}


def count_ops(model: onnx.ModelProto, op_type: str) -> int:
    return sum(1 for node in model.graph.node if node.op_type == op_type)


def _check(model: onnx.ModelProto | str) -> None:
    try:
        onnx.checker.check_model(model, full_check=True)
    except onnx.checker.ValidationError as error:
        raise QuantcoreError(f"the exported QDQ model fails the ONNX checker: {error}") from error


def export(
    prepared: PreparedModel,
    annotation: Annotation,
    out_dir: str | Path,
    *,
    platform: str | None = None,
) -> ExportResult:
    """Write ``model.qdq.onnx`` and ``tqc.json`` into ``out_dir`` (atomically) and return their paths."""
    out_dir = Path(out_dir)
    model = build_qdq_model(prepared, annotation)
    small = model.ByteSize() < PROTOBUF_LIMIT
    if small:
        _check(model)
    model_path = out_dir / MODEL_FILE
    tqc_path = out_dir / TQC_FILE
    files = atomic.save_model(model, model_path)
    if not small:
        _check(str(model_path))  # beyond 2 GB the checker must read the model from disk
    atomic.write_json(tqc_path, tqc_table(annotation, platform=platform))
    return ExportResult(
        model_path=model_path,
        tqc_path=tqc_path,
        files=(*files, tqc_path),
        quantize_linear_nodes=count_ops(model, "QuantizeLinear"),
        dequantize_linear_nodes=count_ops(model, "DequantizeLinear"),
    )
