"""Where a model's inputs and outputs hold their samples, so that QAT can keep every host array
sample-major (samples on axis 0: batches are drawn by indexing axis 0, targets concatenated along it).

A recurrent model's state input (2, batch, 128) is stored as (batch, 2, 128) and moved back to axis 1
for every forward, in ONNX Runtime (the FP32 teacher) and in torch (the trained module) alike; an input
without a batch axis (a sample rate, ``InputSpec.batch_axis`` None) is held once and fed whole to every
batch; an output's batch axis follows the inputs' rule on its declared shape
(``quantcore.runtime.batching.batch_axis``: (2, ?, 128) is batched along axis 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import onnx
import torch

from quantcore.graph.index import value_type
from quantcore.runtime.batching import Batches, batch_axis, batch_symbol, input_specs


@dataclass(frozen=True)
class SampleLayout:
    """inputs: batched input → its batch axis in the model; constants: the inputs fed whole;
    outputs: graph output → its batch axis."""

    inputs: Mapping[str, int]
    constants: Mapping[str, np.ndarray]
    outputs: Mapping[str, int]

    def feed(self, samples: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """ONNX Runtime's feed of sample-major ``samples``: each moved back to its axis, the constants added."""
        feed = {name: np.moveaxis(value, 0, self.inputs.get(name, 0)) for name, value in samples.items()}
        return {**feed, **self.constants}

    def tensors(self, samples: Mapping[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
        """The torch module's inputs of sample-major ``samples``, as ``feed``."""
        tensors = {name: value.movedim(0, self.inputs.get(name, 0)) for name, value in samples.items()}
        constants = {name: torch.from_numpy(np.array(value)).to(device) for name, value in self.constants.items()}
        return {**tensors, **constants}

    def output(self, name: str, value):
        """An output's ``value`` (numpy or torch) with its samples moved to axis 0."""
        axis = self.outputs.get(name, 0)
        if axis == 0:
            return value
        return value.movedim(axis, 0) if isinstance(value, torch.Tensor) else np.moveaxis(value, axis, 0)


def sample_major(
    model: onnx.ModelProto, calibration: Mapping[str, np.ndarray] | Batches, batch: int
) -> tuple[SampleLayout, Batches]:
    """The layout of ``model``'s inputs and outputs, and the batched inputs of ``calibration`` with their
    samples on axis 0 (constants left out: the layout holds them)."""
    batches = calibration if isinstance(calibration, Batches) else Batches(
        calibration, input_specs(model), batch, what="calibration"
    )  # fmt: skip
    inputs = {s.name: s.batch_axis for s in batches.specs if s.batch_axis is not None}
    constants = {s.name: batches.constants[s.name] for s in batches.specs if s.batch_axis is None}
    shapes = [s.shape for s in batches.specs]
    symbol = batch_symbol(shapes)
    dynamic = any(shape and not (isinstance(shape[0], int) and shape[0] > 0) for shape in shapes)
    outputs = {}
    for output in model.graph.output:
        shape = value_type(output)[1]
        axis = batch_axis(None if shape is None else tuple(shape), symbol, dynamic)
        outputs[output.name] = 0 if axis is None else axis
    specs, arrays = [], {}
    for spec in batches.specs:
        if spec.batch_axis is None:
            continue
        shape = spec.shape
        if shape is not None:  # the batch dimension first, the others in order
            shape = (shape[spec.batch_axis], *shape[: spec.batch_axis], *shape[spec.batch_axis + 1 :])
        specs.append(replace(spec, batch_axis=0, shape=shape))
        arrays[spec.name] = np.moveaxis(np.asarray(batches.arrays[spec.name]), spec.batch_axis, 0)
    moved = Batches(arrays, specs, batches.batch_size, what="calibration")
    return SampleLayout(inputs, constants, outputs), moved
