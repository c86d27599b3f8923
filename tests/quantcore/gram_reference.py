"""The whole-model GPTQ that the sequential run (``quantcore.weight_only.segments``) is checked against:
every layer input's XᵀX and Σ|x| from one ONNX Runtime pass of the whole model over the calibration
batches (each layer input an extra output, summed per input tensor in float64, the layers reading one
tensor sharing it), and each layer quantized with the Gram of its input in that FP32 model."""

from __future__ import annotations

import onnx

from quantcore.config import QuantizeConfig
from quantcore.runtime.batching import Batches
from quantcore.runtime.session import open_session
from quantcore.weight_only import QuantizedLayer, WeightLayer, quantize_layer
from quantcore.weight_only.gram import Gram, GramSum


def collect_grams(model: onnx.ModelProto, layers: list[WeightLayer], batches: Batches) -> dict[str, Gram]:
    """Input tensor → its XᵀX and Σ|x| over every batch (X: the tensor reshaped to (-1, K))."""
    names = list(dict.fromkeys(layer.activation for layer in layers))
    sums = {layer.activation: GramSum(layer.shape[0]) for layer in layers}
    with open_session(model, outputs=names) as session:
        for batch in batches:
            for name, value in zip(names, session.run(names, batch), strict=True):
                sums[name].add(value)
    return {name: total.gram() for name, total in sums.items()}


def quantize_whole(layers: list[WeightLayer], grams: dict[str, Gram], config: QuantizeConfig) -> list[QuantizedLayer]:
    """``quantize_layer`` of each layer with its input's Gram from ``collect_grams``."""
    return [quantize_layer(layer, grams[layer.activation], config) for layer in layers]
