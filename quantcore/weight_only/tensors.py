"""Initializers read and written one at a time, so that a weight-only run never holds more than the
layer it is quantizing: a model whose weights stay in their external-data file (loaded with
``load_external_data=False``) is read tensor by tensor at each tensor's offset and length, and the
exported model's tensors are appended to its own external-data file as they are made.

An external tensor's ``location`` is relative to the model's directory and must stay inside it (the
check ``quantcore.prepare.validate.check_external_data`` makes before a model's data is loaded).
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from onnx import numpy_helper

from quantcore.errors import InvalidModelError
from quantcore.graph.protobuf import DETACHABLE

COPY_CHUNK = 64 << 20  # bytes per read when a kept tensor is copied from one data file to another


def is_external(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def _external_info(tensor: onnx.TensorProto) -> dict[str, str]:
    return {entry.key: entry.value for entry in tensor.external_data}


class TensorReader:
    """Values of initializers, held in the model or in external-data files under ``directory`` (the
    model's; None: the model holds all of its data)."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = None if directory is None else directory.resolve()

    def source(self, tensor: onnx.TensorProto) -> tuple[Path, int, int]:
        """(file, offset, length in bytes) of an external tensor's data."""
        info = _external_info(tensor)
        if self.directory is None:
            raise InvalidModelError(f"initializer {tensor.name} is stored in external data, but no directory was given")
        path = (self.directory / info["location"]).resolve()
        if not path.is_relative_to(self.directory) or not path.is_file():
            location = info["location"]
            raise InvalidModelError(f"initializer {tensor.name}: external data {location!r} not beside the model")
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else path.stat().st_size - offset
        return path, offset, length

    def read(self, tensor: onnx.TensorProto) -> np.ndarray:
        """The values of ``tensor``: a new array (an external tensor's bytes read from its file, nothing
        else of the file)."""
        if not is_external(tensor):
            return numpy_helper.to_array(tensor)
        dtype = DETACHABLE.get(tensor.data_type)
        if dtype is None:
            raise InvalidModelError(f"initializer {tensor.name}: external data of type {tensor.data_type} is not read")
        path, offset, length = self.source(tensor)
        count = int(np.prod(tensor.dims, dtype=np.int64))
        if length != count * dtype.itemsize:
            raise InvalidModelError(f"initializer {tensor.name}: {length} bytes of external data for {count} values")
        return np.fromfile(path, dtype=dtype.newbyteorder("<"), count=count, offset=offset).reshape(tuple(tensor.dims))


class DataFile:
    """The exported model's external-data file, written as tensors come: each appended tensor becomes a
    stub (name, type and shape, ``location``/``offset``/``length``) that the model holds instead."""

    def __init__(self, handle: BinaryIO, location: str) -> None:
        self.handle = handle
        self.location = location

    def _stub(self, tensor: onnx.TensorProto, offset: int) -> onnx.TensorProto:
        stub = onnx.TensorProto(name=tensor.name, dims=tensor.dims, data_type=tensor.data_type)
        stub.data_location = onnx.TensorProto.EXTERNAL
        length = self.handle.tell() - offset
        for key, value in (("location", self.location), ("offset", str(offset)), ("length", str(length))):
            stub.external_data.add(key=key, value=value)
        return stub

    def append(self, tensor: onnx.TensorProto) -> onnx.TensorProto:
        """``tensor`` (its data in ``raw_data``) written to the file; returns its stub."""
        offset = self.handle.tell()
        self.handle.write(tensor.raw_data)
        return self._stub(tensor, offset)

    def copy(self, tensor: onnx.TensorProto, reader: TensorReader) -> onnx.TensorProto:
        """An external tensor's bytes copied from its file into this one, ``COPY_CHUNK`` at a time."""
        path, start, length = reader.source(tensor)
        offset = self.handle.tell()
        with open(path, "rb") as source:
            source.seek(start)
            while length > 0:
                chunk = source.read(min(COPY_CHUNK, length))
                if not chunk:
                    raise InvalidModelError(f"initializer {tensor.name}: its external data file ends early")
                self.handle.write(chunk)
                length -= len(chunk)
        return self._stub(tensor, offset)
