"""The weight-only model on disk: each quantized layer's weight replaced by its codes, in one of two
formats (``WeightOnlyConfig.format``), the rest of the graph as prepared.

``matmulnbits``: the node becomes ``com.microsoft.MatMulNBits`` (ONNX Runtime contrib op, domain
``com.microsoft`` version 1), attributes K, N, bits, block_size and accuracy_level (the config's), inputs
    A          the activation (..., K)
    B          uint8 (N, blocks, block_size·bits/8): column n's codes along K, padded to whole blocks
               with the block's zero point, two 4-bit codes per byte, the first in the low nibble
    scales     float32 (N·blocks), column-major over blocks (n·blocks + block)
    zero_points  asymmetric only: uint8 (N·ceil(blocks·bits/8)), packed like B per column; absent, the
               kernel takes 2^(bits-1), the symmetric grid's z
and a Gemm's bias C follows as an Add (MatMulNBits computes A·W only). An embedding's Gather becomes
``com.microsoft.GatherBlockQuantized`` (version 1; gather_axis 0, quantize_axis 1, block_size, bits),
MatMulNBits' conventions along each row of the table (V, D):
    data       uint8 (V, D·bits/8): row v's codes, two 4-bit codes per byte, the first in the low nibble
    indices    the Gather's
    scales     float32 (V, blocks)
    zero_points  asymmetric only: uint8 (V, ceil(blocks·bits/8)), packed like data; absent, 2^(bits-1)

``dequantize_linear``: the weight becomes a DequantizeLinear (opset 21, blocked: ``axis`` the K axis of
the stored tensor, ``block_size``) of int4/int8 codes q - 2^(bits-1) (symmetric, no zero point) or
uint4/uint8 codes with a uint4/uint8 zero point of the scale's shape (asymmetric), feeding the original
MatMul/Gemm, whose transB is kept (its B stays (N, K), blocked along axis 1), or the Gather, its table
(V, D) blocked along axis 1. The scale has ceil(K / block_size) entries along that axis (the last block
short). The model is converted to opset 21 first (``quantcore.prepare.opset.upgrade_opset``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantcore import atomic
from quantcore.config import QuantizeConfig, WeightOnlyConfig
from quantcore.errors import QuantcoreError
from quantcore.export.qdq import MODEL_FILE, TQC_FILE, ExportResult, count_ops
from quantcore.graph.index import default_opset
from quantcore.graph.protobuf import DETACHED_TENSOR_BYTES, copy_fields
from quantcore.prepare.opset import upgrade_opset
from quantcore.weight_only.blocks import BlockGrid, BlockwiseWeight
from quantcore.weight_only.layers import WeightLayer
from quantcore.weight_only.tensors import DataFile, TensorReader, is_external

BLOCKED_DQ_OPSET = 21  # DequantizeLinear's block_size attribute and int4/uint4 inputs
CONTRIB_DOMAIN = "com.microsoft"
TQC_FORMAT = "quantcore.weight_only/1"


@dataclass(frozen=True)
class QuantizedLayer:
    """A layer, its quantized weight, ready to write, and the report's row of it."""

    layer: WeightLayer
    weight: BlockwiseWeight
    row: dict[str, Any]


def pack_nibbles(values: np.ndarray) -> np.ndarray:
    """uint8 codes in [0, 15] (..., M) → (..., ceil(M/2)) bytes, element 2j in the low nibble."""
    values = np.asarray(values, dtype=np.uint8)
    if values.shape[-1] % 2:
        values = np.concatenate([values, np.zeros((*values.shape[:-1], 1), np.uint8)], axis=-1)
    return (values[..., 0::2] & 0x0F) | ((values[..., 1::2] & 0x0F) << 4)


def _packed(values: np.ndarray, bits: int) -> np.ndarray:
    return pack_nibbles(values) if bits == 4 else np.asarray(values, dtype=np.uint8)


def _by_column(values: np.ndarray, bits: int) -> np.ndarray:
    """(K', N) integer codes → (N, ceil(K'·bits/8)) bytes, each column's codes along K packed: how both
    contrib ops store their data and zero points."""
    return _packed(np.ascontiguousarray(values.T), bits)


def matmulnbits_tensors(weight: BlockwiseWeight, name: str) -> list[onnx.TensorProto]:
    """[B, scales] (+ zero_points when asymmetric) as the module docstring lays them out."""
    grid = weight.grid
    k, n = weight.shape
    blocks = grid.num_blocks(k)
    padded = np.repeat(weight.zero_points[-1:], blocks * grid.block_size - k, axis=0)  # codes of ŵ = 0
    codes = np.concatenate([weight.codes, padded]).T.reshape(n, blocks, grid.block_size)  # (N, blocks, bs)
    tensors = [
        numpy_helper.from_array(_packed(codes, grid.bits), f"{name}_q{grid.bits}"),
        numpy_helper.from_array(np.ascontiguousarray(weight.scales.T).reshape(-1), f"{name}_scales"),
    ]
    if not grid.symmetric:
        zeros = _by_column(weight.zero_points, grid.bits).reshape(-1)  # (N·ceil(blocks·b/8))
        tensors.append(numpy_helper.from_array(zeros, f"{name}_zero_points"))
    return tensors


def gather_tensors(weight: BlockwiseWeight, name: str) -> list[onnx.TensorProto]:
    """[data, scales] (+ zero_points when asymmetric) of an embedding's GatherBlockQuantized, from its
    W = tableᵀ (D, V), as the module docstring lays them out."""
    grid = weight.grid
    tensors = [
        numpy_helper.from_array(_by_column(weight.codes, grid.bits), f"{name}_q{grid.bits}"),
        numpy_helper.from_array(np.ascontiguousarray(weight.scales.T), f"{name}_scales"),
    ]
    if not grid.symmetric:
        tensors.append(numpy_helper.from_array(_by_column(weight.zero_points, grid.bits), f"{name}_zero_points"))
    return tensors


def _integer_tensor(values: np.ndarray, bits: int, signed: bool, name: str) -> onnx.TensorProto:
    """``values`` (integer codes) as an int4/uint4/int8/uint8 initializer."""
    if bits == 8:
        return numpy_helper.from_array(values.astype(np.int8 if signed else np.uint8), name)
    data_type = TensorProto.INT4 if signed else TensorProto.UINT4
    raw = pack_nibbles(values.astype(np.int64).reshape(-1) & 0x0F).tobytes()
    return helper.make_tensor(name, data_type, list(values.shape), raw, raw=True)


def dequantize_tensors(weight: BlockwiseWeight, transposed: bool, name: str) -> list[onnx.TensorProto]:
    """[codes, scale] (+ zero point when asymmetric) for a blocked DequantizeLinear, laid out as the
    original initializer: (K, N) blocked on axis 0, or (N, K) on axis 1 for a Gemm with transB."""
    grid = weight.grid
    codes, scales, zeros = weight.codes.astype(np.int64), weight.scales, weight.zero_points
    if grid.symmetric:
        codes = codes - grid.default_zero_point
    if transposed:
        codes, scales, zeros = codes.T, scales.T, zeros.T
    tensors = [
        _integer_tensor(codes, grid.bits, grid.symmetric, f"{name}_codes"),
        numpy_helper.from_array(np.ascontiguousarray(scales), f"{name}_scale"),
    ]
    if not grid.symmetric:
        tensors.append(_integer_tensor(np.ascontiguousarray(zeros), grid.bits, False, f"{name}_zero_point"))
    return tensors


@dataclass(frozen=True)
class Written:
    """A layer as written: its node's rewrite needs the names of its tensors, not their data."""

    layer: WeightLayer
    grid: BlockGrid
    tensors: tuple[str, ...]


def _rewrite(graph: onnx.GraphProto, written: list[Written], options: WeightOnlyConfig) -> None:
    """Replace each written layer's node of ``graph`` (in place) as ``options.format`` says."""
    by_node = {w.layer.node: w for w in written}
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        entry = by_node.get(node.name)
        if entry is None:
            nodes.append(node)
            continue
        layer, grid = entry.layer, entry.grid
        if layer.op_type == "Gather" and options.format == "matmulnbits":
            indices = node.input[1]
            nodes.append(
                helper.make_node(
                    "GatherBlockQuantized",
                    [entry.tensors[0], indices, *entry.tensors[1:]],
                    list(node.output),
                    name=node.name,
                    domain=CONTRIB_DOMAIN,
                    gather_axis=0,
                    quantize_axis=1,
                    block_size=grid.block_size,
                    bits=grid.bits,
                )
            )
            continue
        if options.format == "dequantize_linear":
            dequantized = f"{layer.weight_name}_dequantized"
            nodes.append(
                helper.make_node(
                    "DequantizeLinear",
                    list(entry.tensors),
                    [dequantized],
                    name=f"{node.name}_dequantize",
                    axis=1 if layer.transposed else 0,
                    block_size=grid.block_size,
                )
            )
            node.input[0 if layer.op_type == "Gather" else 1] = dequantized
            nodes.append(node)
            continue
        k, n = layer.shape
        bias = node.input[2] if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2] else None
        product = f"{node.output[0]}_nbits" if bias else node.output[0]
        nodes.append(
            helper.make_node(
                "MatMulNBits",
                [node.input[0], *entry.tensors],  # as written: AWQ's inserted Mul renames it
                [product],
                name=node.name,
                domain=CONTRIB_DOMAIN,
                K=k,
                N=n,
                bits=grid.bits,
                block_size=grid.block_size,
                accuracy_level=options.accuracy_level,
            )
        )
        if bias:
            nodes.append(helper.make_node("Add", [product, bias], [node.output[0]], name=f"{node.name}_bias"))
    del graph.node[:]
    graph.node.extend(nodes)


def stored_bytes(weight: BlockwiseWeight) -> int:
    """Bytes of a layer's stored codes (packed), scales and zero points (asymmetric only)."""
    bits = weight.grid.bits
    size = -(-weight.codes.size * bits // 8) + weight.scales.nbytes
    return size + (0 if weight.grid.symmetric else -(-weight.zero_points.size * bits // 8))


def _header(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every field of ``model`` but its initializers (copying none of their data)."""
    header = copy_fields(model, onnx.ModelProto(), skip="graph")
    copy_fields(model.graph, header.graph, skip="initializer")
    return header


def _kept(tensor: onnx.TensorProto, data: DataFile | None, reader: TensorReader) -> onnx.TensorProto:
    """An initializer the export keeps, as the exported model holds it: with external data, a tensor
    stored outside the model (or large, with its data in ``raw_data``) goes to the data file."""
    if data is not None and is_external(tensor):
        return data.copy(tensor, reader)
    if data is not None and len(tensor.raw_data) >= DETACHED_TENSOR_BYTES:
        return data.append(tensor)
    copy = onnx.TensorProto()
    copy.CopyFrom(tensor)
    return copy


def _upgraded(header: onnx.ModelProto, initializers: Iterable[onnx.TensorProto]) -> onnx.ModelProto:
    """``header`` (no initializers yet) converted to ``BLOCKED_DQ_OPSET``, the converter shown the
    ``initializers`` as graph inputs of their type and shape (it refuses a node input that nothing
    defines, and its checker would look for external data that is not written yet), taken out again."""
    inputs = header.graph.input
    start = len(inputs)
    inputs.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in initializers)
    upgraded = upgrade_opset(header, BLOCKED_DQ_OPSET)
    del upgraded.graph.input[start:]
    return upgraded


def _stage(
    model: onnx.ModelProto,
    quantized: Iterable[QuantizedLayer],
    options: WeightOnlyConfig,
    staging: Path,
    reader: TensorReader,
    external: bool,
) -> tuple[onnx.ModelProto, list[dict[str, Any]]]:
    """The exported model written into ``staging`` (``MODEL_FILE``, and with ``external`` its data file
    ``MODEL_FILE.data``), taking ``quantized`` one layer at a time; returns it (as written, its external
    tensors stubs) and the layers' report rows."""
    form = options.format
    replaced: set[str] = set()  # the weights quantized, known only as the layers come
    layers = {n.input[1] for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1}
    layers |= {n.input[0] for n in model.graph.node if n.op_type == "Gather"}
    data_name = f"{MODEL_FILE}.data"
    with contextlib.ExitStack() as stack:
        data = DataFile(stack.enter_context(open(staging / data_name, "wb")), data_name) if external else None
        header = _header(model)
        if form == "dequantize_linear":
            header = _upgraded(header, model.graph.initializer)
        pending = []  # weights of MatMul/Gemm nodes: written when known to be kept
        for tensor in model.graph.initializer:
            if tensor.name in layers:
                pending.append(tensor)
            else:
                header.graph.initializer.append(_kept(tensor, data, reader))
        written, rows = [], []
        for entry in quantized:
            layer, weight = entry.layer, entry.weight
            if form == "dequantize_linear":
                tensors = dequantize_tensors(weight, layer.transposed, layer.weight_name)
            elif layer.op_type == "Gather":
                tensors = gather_tensors(weight, layer.weight_name)
            else:
                tensors = matmulnbits_tensors(weight, layer.weight_name)
            header.graph.initializer.extend(t if data is None else data.append(t) for t in tensors)
            written.append(Written(layer, weight.grid, tuple(t.name for t in tensors)))
            replaced.add(layer.weight_name)
            rows.append(entry.row)
        header.graph.initializer.extend(_kept(t, data, reader) for t in pending if t.name not in replaced)
    _rewrite(header.graph, written, options)
    if form == "matmulnbits" and all(o.domain != CONTRIB_DOMAIN for o in header.opset_import):
        header.opset_import.append(helper.make_opsetid(CONTRIB_DOMAIN, 1))
    (staging / MODEL_FILE).write_bytes(header.SerializeToString())
    return header, rows


def write(
    model: onnx.ModelProto,
    quantized: Iterable[QuantizedLayer],
    config: QuantizeConfig,
    out_dir: Path,
    reader: TensorReader,
    external: bool,
) -> tuple[ExportResult, list[dict[str, Any]]]:
    """Write the weight-only model (``MODEL_FILE``; with ``external``, its tensors of 1 MiB or more in
    ``MODEL_FILE.data`` beside it) and the layers' table (``tqc.json``) into ``out_dir``, each whole or
    not at all, taking ``quantized`` one layer at a time (``reader``: the values of ``model``'s
    initializers, some of them perhaps still in their external-data files); the model must pass
    ``onnx.checker`` (full check, external data included). Returns the files and the report's rows."""
    options = config.weight_only
    assert options is not None  # the weight-only platform's config always has them
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{MODEL_FILE}.tmp-", dir=out_dir))
    try:
        written, rows = _stage(model, quantized, options, staging, reader, external)
        try:
            onnx.checker.check_model(str(staging / MODEL_FILE), full_check=True)
        except onnx.checker.ValidationError as error:
            raise QuantcoreError(f"the exported weight-only model fails the ONNX checker: {error}") from error
        files = [out_dir / name for name in ((f"{MODEL_FILE}.data",) if external else ())] + [out_dir / MODEL_FILE]
        for path in files:  # the data first: a model file never names data that is not there yet
            os.replace(staging / path.name, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    model_path, tqc_path = out_dir / MODEL_FILE, out_dir / TQC_FILE
    table = {"weight_only": options.to_dict(), "bits": config.precision_spec.weight_bits, "layers": rows}
    atomic.write_json(tqc_path, {"format": TQC_FORMAT, "platform": config.platform, **table})
    result = ExportResult(
        model_path=model_path,
        tqc_path=tqc_path,
        files=(model_path, *files[:-1], tqc_path),
        quantize_linear_nodes=0,
        dequantize_linear_nodes=count_ops(written, "DequantizeLinear"),
        opset=default_opset(written) or BLOCKED_DQ_OPSET,
    )
    return result, rows
