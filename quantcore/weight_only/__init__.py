"""Weight-only quantization (platform ``onnxruntime-weight-only``): MatMul/Gemm weights stored at 4 or
8 bits in blocks along the reduction axis, activations float32.

    layers = weight_layers(model, annotation)            # the annotated MatMul/Gemm weights, W (K, N)
    grams = collect_grams(model, layers, batches, ...)   # GPTQ, AWQ: XᵀX and Σ|x| of each layer input
    model, scales = awq_scaling(model, layers, grams, config, monitor)   # AWQ only
    quantized, rows = quantize_layers(layers, grams, config, monitor, scales)
    exported = write(model, quantized, config, out_dir, table)

``quantcore.weight_only.blocks`` holds the grid and round-to-nearest, ``gptq`` the GPTQ algorithm, ``awq``
AWQ's channel scales, ``hqq`` the data-free HQQ fit, ``layers`` the layer list and ``gram`` the
calibration statistics, ``writer`` the two formats (MatMulNBits, blocked DequantizeLinear),
``language`` the causal-LM metrics. ``quantcore.pipeline.weight_only`` runs them as stages.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx

from quantcore.config import QuantizeConfig
from quantcore.graph.channel_scaling import find_groups, scale_channels
from quantcore.progress import Monitor
from quantcore.weight_only import awq
from quantcore.weight_only.awq import ChannelScale
from quantcore.weight_only.blocks import BlockGrid, BlockwiseWeight, quantize_rtn
from quantcore.weight_only.gptq import quantize_gptq
from quantcore.weight_only.gram import Gram
from quantcore.weight_only.hqq import quantize_hqq
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


def awq_scaling(
    model: onnx.ModelProto,
    layers: list[WeightLayer],
    grams: Mapping[str, Gram],
    config: QuantizeConfig,
    monitor: Monitor,
) -> tuple[onnx.ModelProto, dict[str, ChannelScale]]:
    """AWQ's searched channel scales applied to ``model`` (``quantcore.weight_only.awq``): the model with
    each group's weights times s and its input ÷ s folded (FP32, the same function), and layer node → the
    ``ChannelScale`` its weight was multiplied by."""
    groups = find_groups(model.graph)
    chosen = awq.search(groups, layers, grams, grid_of(config), monitor)
    scaled = scale_channels(model, [g for g in groups if g.input in chosen], {i: c.scale for i, c in chosen.items()})
    return scaled, awq.layer_scales(groups, chosen)


def quantize_layers(
    layers: list[WeightLayer],
    grams: Mapping[str, Gram] | None,
    config: QuantizeConfig,
    monitor: Monitor,
    scales: Mapping[str, ChannelScale] | None = None,
) -> tuple[list[QuantizedLayer], list[dict[str, Any]]]:
    """Each layer's weight quantized by ``config.weight_only.algorithm`` (``grams``: its inputs' XᵀX,
    needed by GPTQ and AWQ, None for RTN and HQQ; ``scales``: AWQ's, by layer node, from ``awq_scaling``),
    and the report's row per layer: node, op type, weight, [K, N], FP32 and stored bytes; with ``grams``,
    the relative output error ‖XW - XŴ‖²_F / ‖XW‖²_F on the calibration data of the weight kept (AWQ: Ŵ
    = diag(1/s)·Q(diag(s)·W), what the layer computes with its input ÷ s) and of round-to-nearest, the
    damping GPTQ used and the alpha AWQ chose."""
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
        kept, computed = rtn, rtn.dequantize()  # stored codes; the weight the layer computes with
        if options.algorithm == "hqq":
            kept = quantize_hqq(layer.weight, grid)
            computed = kept.dequantize()
        elif options.algorithm == "awq" and grams is not None:
            choice = (scales or {}).get(layer.node)  # None: a layer in no group keeps s = 1
            scale = np.ones(layer.shape[0]) if choice is None else choice.scale
            kept, computed = awq.quantize_layer(layer.weight, grams[layer.activation], scale, grid)
            row["awq_alpha"] = None if choice is None else choice.alpha
        if grams is not None:
            gram = grams[layer.activation]
            if options.algorithm == "gptq":
                result = quantize_gptq(
                    layer.weight, gram, grid, damping=options.damping, act_order=options.act_order, layer=layer.node
                )
                kept, computed = result.weight, result.weight.dequantize()
                row["damping"] = result.damping
            row["output_error"] = _relative(gram.output_error(layer.weight - computed), gram, layer.weight)
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
    "awq_scaling",
    "collect_grams",
    "grid_of",
    "quantize_layers",
    "quantize_rtn",
    "weight_layers",
    "write",
]
