"""Stage 5, export: the prepared graph (the user's graph with BN folded) plus QuantizeLinear /
DequantizeLinear, and the table of every tensor's quantization.

Activations: tensor t gets one pair ``t → QuantizeLinear → DequantizeLinear → t_dequantized``,
placed right after t's producer; every annotated consumer reads ``t_dequantized``, anything else
(other consumers, graph outputs) still reads float t. When the config's quant range is narrower than
its storage type (a 3-bit config stored as int4, 7-bit weights in int8), QuantizeLinear would saturate
at the type's range, so a Clip to [(quant_min - o)·s, (quant_max - o)·s] goes in front of it.
A dynamic config (platform onnxruntime-dynamic) gets ``t → DynamicQuantizeLinear → DequantizeLinear``
instead: uint8 codes, scale and zero point all computed from t's value at run time (opset 11).

Weights: stored quantized, ``q = clip(round(W / s) + o, quant_min, quant_max)`` (FP8: W/s on the E4M3
grid) as an initializer of the storage type, followed by DequantizeLinear (``axis`` = the
output-channel axis when per-channel). This is TensorRT's recommended form and ONNX Runtime's CPU EP
runs it; the float initializer is removed once nothing else reads it. Their table state is BAKED.
Biases linked in the annotation (onnxruntime): int32 codes round(b / (s_x · s_w)), offset 0.
An annotation with ``unsigned_weights`` stores int8 weight codes as uint8, codes and zero point both
shifted by 128 (the same values; ``quantcore.numerics.storage_type.unsigned_twin``); the table says so
(``storage_shift``).

Storage types and opsets (``quantcore.numerics.storage_type.storage_type``): int8/uint8 (13 per-channel),
float8e4m3fn/float8e5m2 (19), int4/uint4/int16/uint16 (21). The model's default opset is raised to the
highest one needed, and no further (``quantcore.prepare.opset.upgrade_opset``, IR version to match).
Graph inputs, outputs, their names and dynamic dimensions, and metadata are those of the prepared
model. The result is checked with ``onnx.checker.check_model(full_check=True)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

from quantcore import atomic
from quantcore.annotate.annotation import Annotation
from quantcore.errors import QuantcoreError, UnsupportedModelError
from quantcore.graph.index import GraphIndex, NameScope, default_opset
from quantcore.graph.protobuf import fits_in_protobuf
from quantcore.numerics.fake_quant import quantize_array
from quantcore.numerics.storage_type import UNSIGNED_SHIFT, StorageType, storage_type, unsigned_twin
from quantcore.numerics.tqc import QuantState, TensorQuantConfig
from quantcore.prepare.opset import required_ir_version, upgrade_opset
from quantcore.prepare.preparation import PreparedModel

MODEL_FILE = "model.qdq.onnx"
TQC_FILE = "tqc.json"
TQC_FORMAT = "quantcore.tqc/2"
INT32_LIMIT = 2**31 - 1
FLOAT8_TORCH = {
    onnx.TensorProto.FLOAT8E4M3FN: torch.float8_e4m3fn,
    onnx.TensorProto.FLOAT8E5M2: torch.float8_e5m2,
}
TYPE_RANGES = {  # full range QuantizeLinear saturates to, per storage type name
    "int8": (-128, 127),
    "uint8": (0, 255),
    "int4": (-8, 7),
    "uint4": (0, 15),
    "int16": (-(2**15), 2**15 - 1),
    "uint16": (0, 2**16 - 1),
}


@dataclass(frozen=True)
class ExportResult:
    model_path: Path
    tqc_path: Path
    files: tuple[Path, ...]  # everything written (model, its external data if any, the table)
    quantize_linear_nodes: int  # QuantizeLinear and DynamicQuantizeLinear
    dequantize_linear_nodes: int
    opset: int = 13  # the exported model's default opset
    warnings: tuple[str, ...] = ()


def storage_of(tqc: TensorQuantConfig) -> StorageType:
    """The ONNX type storing ``tqc`` (widths without a type of their own go to the next wider one)."""
    return storage_type(tqc, widen=True)


def stored_as(name: str, tqc: TensorQuantConfig, annotation: Annotation) -> tuple[StorageType, int]:
    """The ONNX type storing tensor ``name`` and the shift added to its codes and zero point: int8
    weights of an annotation with ``unsigned_weights`` go to uint8 shifted by ``UNSIGNED_SHIFT``."""
    storage = storage_of(tqc)
    if name in annotation.parameters and annotation.unsigned_weights and storage.name == "int8":
        return unsigned_twin(storage), UNSIGNED_SHIFT
    return storage, 0


def typed_tensor(values: np.ndarray, storage: StorageType, name: str) -> onnx.TensorProto:
    """``values`` (integer codes, or float32 values on an FP8 grid) as a tensor of ``storage``'s type."""
    values = np.asarray(values)
    if storage.onnx_type in FLOAT8_TORCH:
        codes = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).to(FLOAT8_TORCH[storage.onnx_type])
        tensor = onnx.TensorProto(name=name, data_type=storage.onnx_type, dims=list(values.shape))
        tensor.raw_data = codes.view(torch.uint8).numpy().tobytes()
        return tensor
    if storage.bits == 4:  # numpy has no 4-bit type: onnx.helper packs two codes per byte
        return helper.make_tensor(name, storage.onnx_type, list(values.shape), values.astype(np.int64).ravel().tolist())
    dtype = helper.tensor_dtype_to_np_dtype(storage.onnx_type)
    return numpy_helper.from_array(values.astype(dtype), name)


def narrow_range(tqc: TensorQuantConfig, storage: StorageType) -> tuple[np.ndarray, np.ndarray] | None:
    """[lo, hi] (float32) an activation must be clipped to before QuantizeLinear so that it saturates at
    the config's range rather than the storage type's; None when the two ranges coincide."""
    if tqc.floating:
        if float(tqc.quant_max) >= tqc.float_format.max:
            return None
    elif (tqc.quant_min, tqc.quant_max) == TYPE_RANGES[storage.name]:
        return None
    if tqc.per_channel:
        raise UnsupportedModelError("a per-channel activation with a narrowed quant range cannot be exported")
    scale = np.asarray(tqc.scale, np.float64)
    offset = np.asarray(tqc.offset, np.float64)
    lo = (float(tqc.quant_min) - offset) * scale
    hi = (float(tqc.quant_max) - offset) * scale
    return lo.astype(np.float32), hi.astype(np.float32)


def bias_codes(
    bias: np.ndarray, activation: TensorQuantConfig, weight: TensorQuantConfig
) -> tuple[np.ndarray, np.ndarray]:
    """(int32 codes, float32 scale) of a bias: s_b = s_x · s_w ((C,) when the weight is per-channel),
    q_b = clip(round(b / s_b), -2^31 + 1, 2^31 - 1)."""
    scale = (np.asarray(activation.scale, np.float32) * np.asarray(weight.scale, np.float32)).astype(np.float32)
    if scale.ndim == 1 and scale.shape[0] != bias.shape[0]:
        raise UnsupportedModelError(f"bias of {bias.shape[0]} channels but {scale.shape[0]} weight scales")
    codes = np.clip(np.round(bias.astype(np.float64) / scale.astype(np.float64)), -INT32_LIMIT, INT32_LIMIT)
    return codes.astype(np.int32), scale


def required_opset(annotation: Annotation) -> int:
    """The lowest default opset that every Q/DQ of the annotation needs."""
    return max((storage_of(tqc).min_opset for tqc in annotation.configs.values()), default=13)


def _with_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    current = default_opset(model) or opset
    if current >= opset:
        return model
    originals = {node.name: node for node in model.graph.node}
    converted = upgrade_opset(model, opset)
    # The converter may add nodes (e.g. the `axes` Constant of ReduceMean at opset 18) and append
    # inputs; the annotation stays valid as long as every original node keeps its name, order,
    # existing inputs and outputs.
    kept = [node for node in converted.graph.node if node.name in originals]
    unchanged = [node.name for node in kept] == list(originals) and all(
        list(node.input[: len(originals[node.name].input)]) == list(originals[node.name].input)
        and list(node.output) == list(originals[node.name].output)
        for node in kept
    )
    if not unchanged:
        raise UnsupportedModelError(f"raising the opset from {current} to {opset} changed the graph's nodes")
    converted.ir_version = max(converted.ir_version, required_ir_version(converted))
    return converted


def build_qdq_model(prepared: PreparedModel, annotation: Annotation) -> onnx.ModelProto:
    """A new model: ``prepared.model`` with Q/DQ inserted per the calibrated ``annotation``."""
    for name, tqc in annotation.configs.items():
        if tqc.scale is None and not tqc.dynamic:
            raise ValueError(f"tensor {name!r} is not calibrated (state {tqc.state.value}); run calibrate first")
        if tqc.dynamic and (name in annotation.parameters or storage_of(tqc).name != "uint8" or tqc.per_channel):
            raise UnsupportedModelError(
                f"tensor {name!r}: a dynamic config exports as DynamicQuantizeLinear, which computes a uint8 "
                "per-tensor activation only"
            )
    model = onnx.ModelProto()
    model.CopyFrom(prepared.model)
    model = _with_opset(model, required_opset(annotation))
    graph = model.graph
    index = GraphIndex(graph)
    scope = NameScope(index.used_names())
    nodes_by_name = {node.name: node for node in graph.node}

    head: list[onnx.NodeProto] = []  # weight DQs and Q/DQ of graph inputs, placed before every node
    after: dict[str, list[onnx.NodeProto]] = {}  # producer node name -> Q/DQ of its outputs

    def rewire(tensor: str, uses, dq_out: str) -> None:
        for use in uses:
            node = nodes_by_name[use.node]
            if node.input[use.index] != tensor:
                raise ValueError(
                    f"annotation says {use.node} input {use.index} reads {tensor!r}, the graph says "
                    f"{node.input[use.index]!r}"
                )
            node.input[use.index] = dq_out

    def dequantize(tensor: str, inputs: list[str], dq_out: str, axis: dict[str, int]) -> onnx.NodeProto:
        return helper.make_node(
            "DequantizeLinear", inputs, [dq_out], name=scope.fresh(f"{tensor}_DequantizeLinear"), **axis
        )

    for name, tqc in annotation.configs.items():
        dq_out = scope.fresh(f"{name}_dequantized")
        if tqc.dynamic:  # scale and zero point computed from the value at run time
            codes_name, scale_name, zero_name = (
                scope.fresh(f"{name}_{p}") for p in ("quantized", "scale", "zero_point")
            )
            pair = [
                helper.make_node(
                    "DynamicQuantizeLinear",
                    [name],
                    [codes_name, scale_name, zero_name],
                    name=scope.fresh(f"{name}_DynamicQuantizeLinear"),
                ),
                dequantize(name, [codes_name, scale_name, zero_name], dq_out, {}),
            ]
        else:
            storage, shift = stored_as(name, tqc, annotation)
            scale_name = scope.fresh(f"{name}_scale")
            zero_name = scope.fresh(f"{name}_zero_point")
            graph.initializer.append(numpy_helper.from_array(np.asarray(tqc.scale, dtype=np.float32), scale_name))
            zero = np.zeros(np.shape(tqc.scale)) if tqc.floating else np.asarray(tqc.offset, np.int64) + shift
            graph.initializer.append(typed_tensor(zero, storage, zero_name))
            axis = {"axis": tqc.channel_axis} if tqc.per_channel else {}
            if name in annotation.parameters:
                codes_name = scope.fresh(f"{name}_quantized")
                codes = quantize_array(index.array(name), tqc)
                if shift:
                    codes = codes.astype(np.int64) + shift
                graph.initializer.append(typed_tensor(codes, storage, codes_name))
                head.append(dequantize(name, [codes_name, scale_name, zero_name], dq_out, axis))
                rewire(name, annotation.consumers[name], dq_out)
                continue
            source = name
            pair = []
            bounds = narrow_range(tqc, storage)
            if bounds is not None:
                lo_name, hi_name = scope.fresh(f"{name}_clip_min"), scope.fresh(f"{name}_clip_max")
                graph.initializer.append(numpy_helper.from_array(bounds[0], lo_name))
                graph.initializer.append(numpy_helper.from_array(bounds[1], hi_name))
                source = scope.fresh(f"{name}_clipped")
                pair.append(
                    helper.make_node("Clip", [name, lo_name, hi_name], [source], name=scope.fresh(f"{name}_Clip"))
                )
            q_out = scope.fresh(f"{name}_quantized")
            pair += [
                helper.make_node(
                    "QuantizeLinear",
                    [source, scale_name, zero_name],
                    [q_out],
                    name=scope.fresh(f"{name}_QuantizeLinear"),
                    **axis,
                ),
                dequantize(name, [q_out, scale_name, zero_name], dq_out, axis),
            ]
        producer = index.producers.get(name)
        (head if producer is None else after.setdefault(producer.name, [])).extend(pair)
        rewire(name, annotation.consumers[name], dq_out)

    for name, link in annotation.biases.items():
        activation, weight = annotation.configs[link.activation], annotation.configs[link.weight]
        codes, scale = bias_codes(index.array(name), activation, weight)
        codes_name, scale_name = scope.fresh(f"{name}_quantized"), scope.fresh(f"{name}_scale")
        zero_name, dq_out = scope.fresh(f"{name}_zero_point"), scope.fresh(f"{name}_dequantized")
        graph.initializer.extend(
            [
                numpy_helper.from_array(codes, codes_name),
                numpy_helper.from_array(scale, scale_name),
                numpy_helper.from_array(np.zeros(scale.shape, np.int32), zero_name),
            ]
        )
        axis = {"axis": 0} if scale.ndim == 1 else {}
        head.append(dequantize(name, [codes_name, scale_name, zero_name], dq_out, axis))
        rewire(name, [link.consumer], dq_out)

    ordered = list(head)
    for node in graph.node:
        ordered.append(node)
        ordered.extend(after.get(node.name, []))
    del graph.node[:]
    graph.node.extend(ordered)

    # Float weights nobody reads any more are dropped (their codes replace them).
    still_read = GraphIndex(graph).consumers
    keep = {i.name for i in graph.input} | {o.name for o in graph.output}
    stored = set(annotation.parameters) | set(annotation.biases)
    for tensor in [t for t in graph.initializer if t.name in stored]:
        if tensor.name not in keep and not still_read.get(tensor.name):
            graph.initializer.remove(tensor)
    return model


def tqc_table(annotation: Annotation, *, platform: str | None = None) -> dict[str, Any]:
    """The JSON table of every quantized tensor: its config (bits, scale(s), offset, axis, observer,
    state), its ONNX storage type, whether it is a weight, and the node inputs reading its quantized
    value; plus the int32 biases with the two tensors their scale comes from."""
    tensors: dict[str, Any] = {}
    for name, tqc in annotation.configs.items():
        parameter = name in annotation.parameters
        if parameter and tqc.state is QuantState.ACTIVATED:
            tqc = tqc.with_state(QuantState.BAKED)
        entry = tqc.to_dict()
        entry["kind"] = "weight" if parameter else "activation"
        storage, shift = stored_as(name, tqc, annotation)
        entry["storage"] = storage.name
        if shift:
            entry["storage_shift"] = shift  # stored codes and zero point are the config's + shift
        entry["consumers"] = [{"node": use.node, "input": use.index} for use in annotation.consumers[name]]
        tensors[name] = entry
    biases = {
        name: {
            "kind": "bias",
            "storage": "int32",
            "scale_from": [link.activation, link.weight],
            "consumers": [{"node": link.consumer.node, "input": link.consumer.index}],
        }
        for name, link in annotation.biases.items()
    }
    return {
        "format": TQC_FORMAT,
        "platform": platform or annotation.platform,
        "tensors": tensors,
        "biases": biases,
        "notes": list(annotation.notes),
    }


QUANTIZERS = ("QuantizeLinear", "DynamicQuantizeLinear")  # the nodes that round a tensor to codes


def count_ops(model: onnx.ModelProto, *op_types: str) -> int:
    return sum(1 for node in model.graph.node if node.op_type in op_types)


def _fails_full_check(model: onnx.ModelProto) -> bool:
    if not fits_in_protobuf(model):
        return False  # not re-checked beyond 2 GB: the exported model must pass on its own
    try:
        onnx.checker.check_model(model, full_check=True)
        return False
    except onnx.checker.ValidationError:
        return True


def _check(model: onnx.ModelProto | str, prepared: onnx.ModelProto) -> list[str]:
    """``onnx.checker`` with ``full_check`` (shape and type inference too). When the full check fails
    on something the prepared model already fails it for (a graph output declared without a shape, as
    the user wrote it), the structural check must pass and a warning says so; otherwise raise."""
    try:
        onnx.checker.check_model(model, full_check=True)
        return []
    except onnx.checker.ValidationError as error:
        full_error = error
    if not _fails_full_check(prepared):
        raise QuantcoreError(f"the exported QDQ model fails the ONNX checker: {full_error}") from full_error
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as error:
        raise QuantcoreError(f"the exported QDQ model fails the ONNX checker: {error}") from error
    return [
        "the exported model passes the structural ONNX check; the full check fails as the input model "
        f"does: {full_error}"
    ]


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
    small = fits_in_protobuf(model)
    warnings = _check(model, prepared.model) if small else []
    model_path = out_dir / MODEL_FILE
    tqc_path = out_dir / TQC_FILE
    files = atomic.save_model(model, model_path)
    if not small:
        warnings = _check(str(model_path), prepared.model)  # beyond 2 GB the checker reads from disk
    atomic.write_json(tqc_path, tqc_table(annotation, platform=platform))
    return ExportResult(
        model_path=model_path,
        tqc_path=tqc_path,
        files=(*files, tqc_path),
        quantize_linear_nodes=count_ops(model, *QUANTIZERS),
        dequantize_linear_nodes=count_ops(model, "DequantizeLinear"),
        opset=default_opset(model) or 13,
        warnings=tuple(warnings),
    )
