"""Weight-only quantization (platform ``onnxruntime-weight-only``): MatMul/Gemm weights stored at 4 or
8 bits in blocks along the reduction axis, activations float32.

    layers = weight_layers(model, annotation, reader)    # the annotated MatMul/Gemm weights, W (K, N)
    embeddings = embedding_layers(model, annotation, reader)   # the annotated Gather tables, W = tableᵀ
    plan = make_plan(model, layers, batches, grid, device, monitor, reader)   # AWQ only: its search
    quantized = quantize_layers(layers + embeddings, config, monitor, plan)   # one layer at a time
    quantized = quantize_sequentially(model, layers, batches, config, monitor, reader)   # GPTQ instead
    quantized += quantize_layers(embeddings, config, monitor, before=len(layers))   # then RTN of the tables
    exported, rows = write(plan.scaled_model(model, reader, layers), quantized, config, out_dir, reader, external)

``quantcore.weight_only.blocks`` holds the grid and round-to-nearest, ``gptq`` the GPTQ algorithm, ``awq``
AWQ's channel scales and ``awq_plan`` their search over the model, ``hqq`` the data-free HQQ fit,
``layers`` the layer list and ``gram`` the calibration statistics, ``segments`` the sequential run of
GPTQ and AWQ, one segment of the graph at a time,
``writer`` the two formats (MatMulNBits, blocked DequantizeLinear), ``language`` the causal-LM metrics,
``tensors`` the reading and writing of one initializer at a time (a model's weights may stay in their
external-data file from load to export).
``quantcore.pipeline.weight_only`` runs them as stages.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx

from quantcore.config import QuantizeConfig
from quantcore.progress import Monitor
from quantcore.runtime.batching import Batches
from quantcore.weight_only import segments
from quantcore.weight_only.awq_plan import AwqPlan, make_plan, quantize_planned
from quantcore.weight_only.blocks import BlockGrid, BlockwiseWeight, quantize_rtn
from quantcore.weight_only.gptq import quantize_gptq
from quantcore.weight_only.gram import Gram
from quantcore.weight_only.hqq import quantize_hqq
from quantcore.weight_only.layers import WeightLayer, embedding_layers, weight_layers
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


def quantize_layer(
    layer: WeightLayer, gram: Gram | None, config: QuantizeConfig, awq_plan: AwqPlan | None = None
) -> QuantizedLayer:
    """``layer``'s weight quantized by ``config.weight_only.algorithm`` (only this W is read and held;
    ``gram``: its input's XᵀX, needed by GPTQ, None otherwise; ``awq_plan``: AWQ's choices, from the
    calibrate stage), with the report's row: node, op type, weight, [K, N], FP32 and stored bytes; with a
    Gram or a plan, the relative output error ‖XW - XŴ‖²_F / ‖XW‖²_F on the calibration data of the weight
    kept (AWQ: what the layer computes with in the unscaled graph) and of round-to-nearest, the damping
    GPTQ used and the alpha AWQ chose."""
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
    kept = rtn
    if options.algorithm == "hqq":
        kept = quantize_hqq(weight, grid)
    elif layer.op_type == "Gather":
        pass  # an embedding: a lookup has no activation for GPTQ or AWQ to weigh
    elif options.algorithm == "awq" and awq_plan is not None:
        kept = quantize_planned(layer, awq_plan, grid)
        chosen = awq_plan.choices[layer.node].scale
        row["awq_alpha"] = None if chosen is None else chosen.alpha  # no group: s = 1
        row["output_error"] = awq_plan.errors[layer.node].output
        row["rtn_output_error"] = awq_plan.errors[layer.node].rtn
    elif options.algorithm == "gptq" and gram is not None:
        result = quantize_gptq(
            weight, gram, grid, damping=options.damping, act_order=options.act_order, layer=layer.node
        )
        kept = result.weight
        row["damping"] = result.damping
    if gram is not None:
        row["output_error"] = _relative(gram.output_error(weight - kept.dequantize()), gram, weight)
        row["rtn_output_error"] = _relative(gram.output_error(weight - rtn.dequantize()), gram, weight)
    row["stored_bytes"] = stored_bytes(kept)
    return QuantizedLayer(layer, kept, row)


def quantize_layers(
    layers: list[WeightLayer],
    config: QuantizeConfig,
    monitor: Monitor,
    awq_plan: AwqPlan | None = None,
    before: int = 0,
) -> Iterator[QuantizedLayer]:
    """``quantize_layer`` of each layer with no Gram (RTN, HQQ, AWQ; embeddings whatever the algorithm),
    one at a time as the caller takes them (``awq_plan``: AWQ's, from ``awq_plan.make_plan``); GPTQ's
    layers come from ``quantize_sequentially``, which reports k/(n+1) after its k-th of n: ``before`` = n
    puts these in the last step, after theirs."""
    algorithm = config.weight_only.algorithm if config.weight_only else ""
    for done, layer in enumerate(layers, start=1):
        monitor.check(STAGE)
        entry = quantize_layer(layer, None, config, awq_plan)
        what = "embedding" if layer.op_type == "Gather" else "layer"
        fraction = (before + done / (len(layers) + 1)) / (before + 1)
        monitor.report(STAGE, fraction, f"{algorithm}: {what} {done}/{len(layers)}")
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
    quantizer = segments.layer_by_layer(lambda layer, gram: quantize_layer(layer, gram, config))
    return segments.run(model, plan, batches, reader, config.device, monitor, quantizer)


__all__ = [
    "AwqPlan",
    "BlockGrid",
    "BlockwiseWeight",
    "Gram",
    "QuantizedLayer",
    "WeightLayer",
    "embedding_layers",
    "grid_of",
    "make_plan",
    "quantize_layer",
    "quantize_layers",
    "quantize_rtn",
    "quantize_sequentially",
    "weight_layers",
    "write",
]
