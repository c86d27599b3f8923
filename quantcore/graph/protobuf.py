"""Models beyond protobuf's 2 GiB: one ModelProto cannot be serialised, nor even measured (``ByteSize``
raises), beyond it. Such a model is held in memory as loaded, and whatever needs it as one protobuf
(ONNX Runtime's sessions, shape inference) gets its *skeleton*: every field of the model, with the
initializers of ``DETACHED_TENSOR_BYTES`` or more replaced by stubs marked external (name, type and
shape, no data). A skeleton is small, and building it copies no weight.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

PROTOBUF_LIMIT = 2**31 - 1 - 64 * 2**20  # serialised size above which a model must use external data
# Initializers at least this large are left out of a skeleton.
DETACHED_TENSOR_BYTES = 1 << 20
STUB_LOCATION = "detached"  # the external-data location a skeleton's stubs name; no such file exists

# Tensor types that numpy_helper gives in their own numpy type (float8 and int4 come in a wider one):
# only these are detached, so that the arrays can stand for the tensors as they are.
DETACHABLE = {
    code: np.dtype(onnx.helper.tensor_dtype_to_np_dtype(code))
    for code in (
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.DOUBLE,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.INT8,
        onnx.TensorProto.UINT8,
        onnx.TensorProto.INT16,
        onnx.TensorProto.UINT16,
        onnx.TensorProto.INT32,
        onnx.TensorProto.UINT32,
        onnx.TensorProto.INT64,
        onnx.TensorProto.UINT64,
    )
}


def fits_in_protobuf(model: onnx.ModelProto) -> bool:
    """Whether ``model`` serialises as one protobuf, under ``PROTOBUF_LIMIT``."""
    return serialised_size(model) < PROTOBUF_LIMIT


def serialised_size(model: onnx.ModelProto) -> float:
    """Bytes of ``model`` serialised; infinite for one beyond protobuf's 2 GiB (measuring that far takes
    protobuf seconds before it gives up, so the initializers' own bytes answer first where they can)."""
    if initializer_bytes(model) >= PROTOBUF_LIMIT:
        return float("inf")
    try:
        return model.ByteSize()
    except Exception:  # protobuf's EncodeError (not a dependency of its own here): large Constant nodes
        return float("inf")


def initializer_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the data of ``model``'s main-graph initializers of the detachable types, from their
    shapes (nothing is read)."""
    return sum(_data_bytes(t) for t in model.graph.initializer)


def skeleton(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[onnx.TensorProto]]:
    """(``model``'s skeleton, the detached initializers of ``model`` itself, in graph order)."""
    header = copy_fields(model, onnx.ModelProto(), skip="graph")
    copy_fields(model.graph, header.graph, skip="initializer")
    detached = []
    for tensor in model.graph.initializer:
        if _data_bytes(tensor) < DETACHED_TENSOR_BYTES or tensor.data_location == onnx.TensorProto.EXTERNAL:
            header.graph.initializer.add().CopyFrom(tensor)
            continue
        stub = header.graph.initializer.add(name=tensor.name, dims=tensor.dims, data_type=tensor.data_type)
        stub.data_location = onnx.TensorProto.EXTERNAL
        stub.external_data.add(key="location", value=STUB_LOCATION)
        detached.append(tensor)
    return header, detached


def _data_bytes(tensor: onnx.TensorProto) -> int:
    """Bytes of a detachable tensor's data, from its shape; 0 for the other types."""
    dtype = DETACHABLE.get(tensor.data_type)
    return int(np.prod(tensor.dims, dtype=np.int64)) * dtype.itemsize if dtype is not None else 0


def copy_fields(source: Any, target: Any, *, skip: str) -> Any:
    """Copies every set field of ``source`` but ``skip`` into ``target``, protobuf messages of one type."""
    for field, value in source.ListFields():
        if field.name == skip:
            continue
        if field.is_repeated:
            getattr(target, field.name).extend(value)
        elif field.message_type is not None:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)
    return target
