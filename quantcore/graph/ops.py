"""Families of ONNX op types that several stages treat alike (preparation, annotation, reconstruction,
TensorRT's Q/DQ rules)."""

from __future__ import annotations

COMPUTE_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})  # ops with a weight operand
# Ops that move, select or reshape values without computing new ones: what enters quantized leaves
# quantized on the same grid. Platforms pass quantization through them; TensorRT moves Q/DQ across them.
DATA_MOVEMENT_OPS = frozenset(
    {
        "Identity", "Dropout", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Split",
        "Pad", "Gather", "Expand", "Tile", "MaxPool", "Resize", "DepthToSpace", "SpaceToDepth",
    }
)  # fmt: skip
