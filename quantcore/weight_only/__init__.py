"""Weight-only quantization (platform ``onnxruntime-weight-only``): MatMul/Gemm weights stored at 4 or
8 bits in blocks along the reduction axis, activations float32.

    layers = weight_layers(model, annotation, reader)    # the annotated MatMul/Gemm weights, W (K, N)
    grams = collect_grams(model, layers, batches, ...)   # AWQ: XᵀX and Σ|x| of each layer input
    model, scales = awq_scaling(model, layers, grams, config, monitor)   # AWQ only
    quantized = quantize_layers(layers, grams, config, monitor, scales)   # one layer at a time
    quantized = quantize_sequentially(model, layers, batches, config, monitor, reader)   # GPTQ instead
    exported, rows = write(model, quantized, config, out_dir, reader, external)

``quantcore.weight_only.blocks`` holds the grid and round-to-nearest, ``gptq`` the GPTQ algorithm, ``awq``
AWQ's channel scales, ``hqq`` the data-free HQQ fit, ``layers`` the layer list and ``gram`` the
calibration statistics, ``segments`` GPTQ's sequential run, one segment of the graph at a time,
``writer`` the two formats (MatMulNBits, blocked DequantizeLinear), ``language`` the causal-LM metrics,
``tensors`` the reading and writing of one initializer at a time (a model's weights may stay in their
external-data file from load to export).
``quantcore.pipeline.weight_only`` runs them as stages.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import onnx

from quantcore.config import QuantizeConfig
from quantcore.graph.channel_scaling import find_groups, scale_channels
from quantcore.progress import Monitor
from quantcore.runtime.batching import Batches
from quantcore.weight_only import awq, segments
from quantcore.weight_only.awq import ChannelScale
from quantcore.weight_only.blocks import BlockGrid, BlockwiseWeight, quantize_rtn
from quantcore.weight_only.gptq import quantize_gptq
from quantcore.weight_only.gram import Gram
from quantcore.weight_only.hqq import quantize_hqq
from quantcore.weight_only.layers import WeightLayer, collect_grams, weight_layers
from quantcore.weight_only.tensors import TensorReader
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


def quantize_layer(
    layer: WeightLayer, gram: Gram | None, config: QuantizeConfig, scale: ChannelScale | None = None
) -> QuantizedLayer:
    """``layer``'s weight quantized by ``config.weight_only.algorithm`` (only this W is read and held;
    ``gram``: its input's XᵀX, needed by GPTQ and AWQ, None for RTN and HQQ; ``scale``: AWQ's, from
    ``awq_scaling``, None for a layer in no group), with the report's row: node, op type, weight, [K, N],
    FP32 and stored bytes; with ``gram``, the relative output error ‖XW - XŴ‖²_F / ‖XW‖²_F on the
    calibration data of the weight kept (AWQ: Ŵ = diag(1/s)·Q(diag(s)·W), what the layer computes with
    its input ÷ s) and of round-to-nearest, the damping GPTQ used and the alpha AWQ chose."""
    options = config.weight_only
    assert options is not None
    grid = grid_of(config)
    weight = layer.read()  # (K, N) float32
    rtn = quantize_rtn(weight, grid)
    row: dict[str, Any] = {
        "node": layer.node,
        "op_type": layer.op_type,
        "weight": layer.weight_name,
        "shape": list(layer.shape),
        "fp32_bytes": weight.nbytes,
    }
    kept, computed = rtn, None  # stored codes; the weight the layer computes with (None: the codes')
    if options.algorithm == "hqq":
        kept = quantize_hqq(weight, grid)
    elif options.algorithm == "awq" and gram is not None:
        channels = np.ones(layer.shape[0]) if scale is None else scale.scale  # no group: s = 1
        kept, computed = awq.quantize_layer(weight, gram, channels, grid)
        row["awq_alpha"] = None if scale is None else scale.alpha
    if gram is not None:
        if options.algorithm == "gptq":
            result = quantize_gptq(
                weight, gram, grid, damping=options.damping, act_order=options.act_order, layer=layer.node
            )
            kept = result.weight
            row["damping"] = result.damping
        computed = kept.dequantize() if computed is None else computed
        row["output_error"] = _relative(gram.output_error(weight - computed), gram, weight)
        row["rtn_output_error"] = _relative(gram.output_error(weight - rtn.dequantize()), gram, weight)
    row["stored_bytes"] = stored_bytes(kept)
    return QuantizedLayer(layer, kept, row)


def quantize_layers(
    layers: list[WeightLayer],
    grams: Mapping[str, Gram] | None,
    config: QuantizeConfig,
    monitor: Monitor,
    scales: Mapping[str, ChannelScale] | None = None,
) -> Iterator[QuantizedLayer]:
    """``quantize_layer`` of each layer, one at a time as the caller takes them (``grams``: by input
    tensor, None for RTN and HQQ; ``scales``: AWQ's, by layer node, from ``awq_scaling``)."""
    algorithm = config.weight_only.algorithm if config.weight_only else ""
    for done, layer in enumerate(layers, start=1):
        monitor.check(STAGE)
        gram = None if grams is None else grams[layer.activation]
        entry = quantize_layer(layer, gram, config, (scales or {}).get(layer.node))
        monitor.report(STAGE, done / (len(layers) + 1), f"{algorithm}: layer {done}/{len(layers)}")
        yield entry


def quantize_sequentially(
    model: onnx.ModelProto,
    layers: list[WeightLayer],
    batches: Batches,
    config: QuantizeConfig,
    monitor: Monitor,
    reader: TensorReader,
) -> Iterator[QuantizedLayer]:
    """GPTQ's sequential run (``quantcore.weight_only.segments``): ``quantize_layer`` of each layer with
    the Gram of its input in the model whose earlier segments are already quantized, one segment of
    ``model`` at a time (its initializers read through ``reader``), as the caller takes them."""
    plan = segments.plan(model, layers)
    return segments.run(
        model, plan, batches, reader, config.device, monitor, lambda layer, gram: quantize_layer(layer, gram, config)
    )


__all__ = [
    "BlockGrid",
    "BlockwiseWeight",
    "Gram",
    "QuantizedLayer",
    "WeightLayer",
    "awq_scaling",
    "collect_grams",
    "grid_of",
    "quantize_layer",
    "quantize_layers",
    "quantize_rtn",
    "quantize_sequentially",
    "weight_layers",
    "write",
]
