"""The layers a weight-only run quantizes, read from the annotation.

A layer is a MatMul or Gemm whose weight (input 1) the ``onnxruntime-weight-only`` platform annotated.
Its weight is handled as W (K, N), K the reduction axis: a MatMul's B as stored, a Gemm's B transposed
back when ``transB=1``, and read only when a stage needs it (``WeightLayer.read``): from the model in
memory, or from its external-data file when the model was loaded without it. An embedding (a Gather
whose table, input 0, the platform annotated: ``weight_only.quantize_embeddings``) is a layer too, its
table (V, D) handled as W = tableᵀ (D, V): blocks run along each row, as the lookup reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from quantcore.annotate.annotation import Annotation
from quantcore.annotate.rules import attribute
from quantcore.errors import UnsupportedModelError
from quantcore.weight_only.tensors import TensorReader

IN_MEMORY = TensorReader(None)  # the reader of a model that holds all of its data


@dataclass(frozen=True)
class WeightLayer:
    """One quantized layer: its node, its activation input, its weight initializer and W's shape (K, N)."""

    node: str
    op_type: str
    activation: str
    weight_name: str
    transposed: bool  # a Gemm with transB=1 or an embedding: the initializer holds Wᵀ (N, K)
    shape: tuple[int, int]  # W (K, N)
    initializer: onnx.TensorProto = field(repr=False)
    reader: TensorReader = field(repr=False)

    def read(self) -> np.ndarray:
        """W (K, N) float32, a new array each call (the model keeps no float copy of it)."""
        stored = self.reader.read(self.initializer).astype(np.float32, copy=False)
        return stored.T if self.transposed else stored


def weight_layers(
    model: onnx.ModelProto, annotation: Annotation, reader: TensorReader | None = None
) -> list[WeightLayer]:
    """The annotated MatMul/Gemm weights of ``model`` in graph order, read through ``reader`` (None: the
    model holds all of its data). Raises ``UnsupportedModelError`` when there is none (the platform found
    no MatMul/Gemm with a constant 2-D float weight to quantize)."""
    initializers = {t.name: t for t in model.graph.initializer}
    layers = []
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2 or node.input[1] not in annotation.parameters:
            continue
        transposed = node.op_type == "Gemm" and bool(attribute(node, "transB", 0))
        tensor = initializers[node.input[1]]
        rows, columns = (int(d) for d in tensor.dims)
        shape = (columns, rows) if transposed else (rows, columns)
        layers.append(
            WeightLayer(
                node.name, node.op_type, node.input[0], node.input[1], transposed, shape, tensor, reader or IN_MEMORY
            )
        )
    if not layers:
        kept = "; ".join(sorted({r for r in annotation.reasons.values() if r})[:3])
        raise UnsupportedModelError(
            "weight-only quantization found no MatMul or Gemm with a constant 2-D float32 weight to quantize"
            + (f" (kept float: {kept})" if kept else "")
        )
    return layers


def embedding_layers(
    model: onnx.ModelProto, annotation: Annotation, reader: TensorReader | None = None
) -> list[WeightLayer]:
    """The annotated embedding tables of ``model`` (Gathers of a quantized table) in graph order, each as
    a layer of W = tableᵀ (D, V) whose ``activation`` is the indices."""
    initializers = {t.name: t for t in model.graph.initializer}
    layers = []
    for node in model.graph.node:
        if node.op_type != "Gather" or node.input[0] not in annotation.parameters:
            continue
        tensor = initializers[node.input[0]]
        rows, width = (int(d) for d in tensor.dims)
        layers.append(
            WeightLayer(
                node.name, node.op_type, node.input[1], node.input[0], True, (width, rows), tensor, reader or IN_MEMORY
            )
        )
    return layers
