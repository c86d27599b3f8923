"""Weight-only quantization (platform ``onnxruntime-weight-only``): MatMul/Gemm weights stored at 4 or
8 bits in blocks along the reduction axis, activations float32.

    layers = weight_layers(model, annotation)            # the annotated MatMul/Gemm weights, W (K, N)
    grams = collect_grams(model, layers, batches, ...)   # GPTQ only: XᵀX of each layer input, streamed
    quantized, rows = quantize_layers(layers, grams, config)
    exported = write(model, quantized, config, out_dir, table)

``quantcore.weight_only.blocks`` holds the grid and round-to-nearest, ``gptq`` the GPTQ algorithm,
``layers`` the layer list and the Hessian statistics, ``writer`` the two formats (MatMulNBits, blocked
DequantizeLinear). ``quantcore.pipeline.weight_only`` runs them as stages.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quantcore.config import QuantizeConfig
from quantcore.progress import Monitor
from quantcore.weight_only.blocks import BlockGrid, BlockwiseWeight, quantize_rtn
from quantcore.weight_only.gptq import Gram, quantize_gptq
from quantcore.weight_only.layers import WeightLayer, collect_grams, weight_layers
from quantcore.weight_only.writer import QuantizedLayer, stored_bytes, write

STAGE = "export"


def grid_of(config: QuantizeConfig) -> BlockGrid:
    options = config.weight_only
    assert options is not None  # the weight-only platform's config always has them
    return BlockGrid(config.precision_spec.weight_bits, options.block_size, options.symmetric)


def _relative(error: float, gram: Gram, weight: np.ndarray) -> float | None:
    """‖XΔ‖² / ‖XW‖² (None when XW is 0 on the calibration data)."""
    signal = gram.output_error(weight)
    return error / signal if signal > 0 else None


def quantize_layers(
    layers: list[WeightLayer], grams: dict[str, Gram] | None, config: QuantizeConfig, monitor: Monitor
) -> tuple[list[QuantizedLayer], list[dict[str, Any]]]:
    """Each layer's weight quantized by ``config.weight_only.algorithm`` (``grams``: its inputs' XᵀX,
    needed by GPTQ, None for RTN), and the report's row per layer: node, op type, weight, [K, N], FP32
    and stored bytes; with ``grams``, the relative output error ‖XW - XŴ‖²_F / ‖XW‖²_F on the calibration
    data of the weight kept and of round-to-nearest, and the damping GPTQ used."""
    options = config.weight_only
    assert options is not None
    grid = grid_of(config)
    quantized, rows = [], []
    for done, layer in enumerate(layers, start=1):
        monitor.check(STAGE)
        rtn = quantize_rtn(layer.weight, grid)
        row: dict[str, Any] = {
            "node": layer.node,
            "op_type": layer.op_type,
            "weight": layer.weight_name,
            "shape": list(layer.shape),
            "fp32_bytes": layer.weight.nbytes,
        }
        kept: BlockwiseWeight = rtn
        if grams is not None:
            gram = grams[layer.activation]
            if options.algorithm == "gptq":
                result = quantize_gptq(
                    layer.weight, gram, grid, damping=options.damping, act_order=options.act_order, layer=layer.node
                )
                kept = result.weight
                row["damping"] = result.damping
            row["output_error"] = _relative(gram.output_error(layer.weight - kept.dequantize()), gram, layer.weight)
            row["rtn_output_error"] = _relative(gram.output_error(layer.weight - rtn.dequantize()), gram, layer.weight)
        row["stored_bytes"] = stored_bytes(kept)
        quantized.append(QuantizedLayer(layer, kept))
        rows.append(row)
        monitor.report(STAGE, done / (len(layers) + 1), f"{options.algorithm}: layer {done}/{len(layers)}")
    return quantized, rows


__all__ = [
    "BlockGrid",
    "BlockwiseWeight",
    "Gram",
    "QuantizedLayer",
    "WeightLayer",
    "collect_grams",
    "grid_of",
    "quantize_layers",
    "quantize_rtn",
    "weight_layers",
    "write",
]
