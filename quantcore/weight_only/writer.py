"""The weight-only model on disk: each quantized layer's weight replaced by its codes, in one of two
formats (``WeightOnlyConfig.format``), the rest of the graph as prepared.

``matmulnbits``: the node becomes ``com.microsoft.MatMulNBits`` (ONNX Runtime contrib op, domain
``com.microsoft`` version 1), attributes K, N, bits, block_size, inputs
    A          the activation (..., K)
    B          uint8 (N, blocks, block_size·bits/8): column n's codes along K, padded to whole blocks
               with the block's zero point, two 4-bit codes per byte, the first in the low nibble
    scales     float32 (N·blocks), column-major over blocks (n·blocks + block)
    zero_points  asymmetric only: uint8 (N·ceil(blocks·bits/8)), packed like B per column; absent, the
               kernel takes 2^(bits-1), the symmetric grid's z
and a Gemm's bias C follows as an Add (MatMulNBits computes A·W only).

``dequantize_linear``: the weight becomes a DequantizeLinear (opset 21, blocked: ``axis`` the K axis of
the stored tensor, ``block_size``) of int4/int8 codes q - 2^(bits-1) (symmetric, no zero point) or
uint4/uint8 codes with a uint4/uint8 zero point of the scale's shape (asymmetric), feeding the original
MatMul/Gemm, whose transB is kept (its B stays (N, K), blocked along axis 1). The scale has ceil(K /
block_size) entries along that axis (the last block short). The model is converted to opset 21 first
(``quantcore.prepare.opset.upgrade_opset``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantcore import atomic
from quantcore.config import QuantizeConfig
from quantcore.errors import QuantcoreError
from quantcore.export.qdq import MODEL_FILE, TQC_FILE, ExportResult, count_ops
from quantcore.graph.index import default_opset
from quantcore.prepare.opset import upgrade_opset
from quantcore.weight_only.blocks import BlockwiseWeight
from quantcore.weight_only.layers import WeightLayer

BLOCKED_DQ_OPSET = 21  # DequantizeLinear's block_size attribute and int4/uint4 inputs
CONTRIB_DOMAIN = "com.microsoft"
TQC_FORMAT = "quantcore.weight_only/1"


@dataclass(frozen=True)
class QuantizedLayer:
    """A layer and its quantized weight, ready to write."""

    layer: WeightLayer
    weight: BlockwiseWeight


def pack_nibbles(values: np.ndarray) -> np.ndarray:
    """uint8 codes in [0, 15] (..., M) → (..., ceil(M/2)) bytes, element 2j in the low nibble."""
    values = np.asarray(values, dtype=np.uint8)
    if values.shape[-1] % 2:
        values = np.concatenate([values, np.zeros((*values.shape[:-1], 1), np.uint8)], axis=-1)
    return (values[..., 0::2] & 0x0F) | ((values[..., 1::2] & 0x0F) << 4)


def _packed(values: np.ndarray, bits: int) -> np.ndarray:
    return pack_nibbles(values) if bits == 4 else np.asarray(values, dtype=np.uint8)


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
        zeros = _packed(np.ascontiguousarray(weight.zero_points.T), grid.bits).reshape(-1)  # (N·ceil(blocks·b/8))
        tensors.append(numpy_helper.from_array(zeros, f"{name}_zero_points"))
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


def _rewrite(model: onnx.ModelProto, quantized: list[QuantizedLayer], form: str) -> None:
    """Replace each layer's weight in ``model`` (in place) as ``form`` says."""
    graph = model.graph
    by_node = {q.layer.node: q for q in quantized}
    replaced = {q.layer.weight_name for q in quantized}
    kept = [t for t in graph.initializer if t.name not in replaced]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        entry = by_node.get(node.name)
        if entry is None:
            nodes.append(node)
            continue
        layer, weight = entry.layer, entry.weight
        if form == "dequantize_linear":
            tensors = dequantize_tensors(weight, layer.transposed, layer.weight_name)
            graph.initializer.extend(tensors)
            axis = 1 if layer.transposed else 0
            dequantized = f"{layer.weight_name}_dequantized"
            nodes.append(
                helper.make_node(
                    "DequantizeLinear",
                    [t.name for t in tensors],
                    [dequantized],
                    name=f"{node.name}_dequantize",
                    axis=axis,
                    block_size=weight.grid.block_size,
                )
            )
            node.input[1] = dequantized
            nodes.append(node)
            continue
        tensors = matmulnbits_tensors(weight, layer.weight_name)
        graph.initializer.extend(tensors)
        k, n = layer.shape
        bias = node.input[2] if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2] else None
        product = f"{node.output[0]}_nbits" if bias else node.output[0]
        nodes.append(
            helper.make_node(
                "MatMulNBits",
                [node.input[0], *(t.name for t in tensors)],  # as written: AWQ's inserted Mul renames it
                [product],
                name=node.name,
                domain=CONTRIB_DOMAIN,
                K=k,
                N=n,
                bits=weight.grid.bits,
                block_size=weight.grid.block_size,
            )
        )
        if bias:
            nodes.append(helper.make_node("Add", [product, bias], [node.output[0]], name=f"{node.name}_bias"))
    del graph.node[:]
    graph.node.extend(nodes)
    if form == "matmulnbits" and all(o.domain != CONTRIB_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(CONTRIB_DOMAIN, 1))


def stored_bytes(weight: BlockwiseWeight) -> int:
    """Bytes of a layer's stored codes (packed), scales and zero points (asymmetric only)."""
    bits = weight.grid.bits
    size = -(-weight.codes.size * bits // 8) + weight.scales.nbytes
    return size + (0 if weight.grid.symmetric else -(-weight.zero_points.size * bits // 8))


def write(
    model: onnx.ModelProto,
    quantized: list[QuantizedLayer],
    config: QuantizeConfig,
    out_dir: Path,
    table: dict[str, Any],
) -> ExportResult:
    """Write the weight-only model (``MODEL_FILE``) and ``table`` (the layers, as ``tqc.json``) into
    ``out_dir``, each whole or not at all; the model must pass ``onnx.checker`` (full check)."""
    options = config.weight_only
    assert options is not None  # the weight-only platform's config always has them
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    if options.format == "dequantize_linear":
        copy = upgrade_opset(copy, BLOCKED_DQ_OPSET)
    _rewrite(copy, quantized, options.format)
    try:
        onnx.checker.check_model(copy, full_check=True)
    except onnx.checker.ValidationError as error:
        raise QuantcoreError(f"the exported weight-only model fails the ONNX checker: {error}") from error
    model_path, tqc_path = out_dir / MODEL_FILE, out_dir / TQC_FILE
    files = atomic.save_model(copy, model_path)
    atomic.write_json(tqc_path, {"format": TQC_FORMAT, "platform": config.platform, **table})
    return ExportResult(
        model_path=model_path,
        tqc_path=tqc_path,
        files=(*files, tqc_path),
        quantize_linear_nodes=0,
        dequantize_linear_nodes=count_ops(copy, "DequantizeLinear"),
        opset=default_opset(copy) or BLOCKED_DQ_OPSET,
    )
