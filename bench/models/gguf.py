"""A reader of GGUF files (llama.cpp's model format, version 2 and 3) for the bench's language model:
the metadata and the tensors, dequantized to float32 from the block types a small model's file uses.

Layout: the magic ``GGUF``, a uint32 version, uint64 tensor and metadata counts; the metadata as (string
key, uint32 type, value) triples; per tensor its name, rank, dimensions (the fastest-varying first), uint32
type and the byte offset of its data within the data section, which starts at the next multiple of
``general.alignment`` (32 when absent) after the tensor table. Strings are a uint64 length and UTF-8 bytes;
all little-endian. Block types (32 weights a block):

- Q4_0: fp16 d, 16 bytes of 4-bit codes q; w = d·(q - 8).
- Q4_1: fp16 d, fp16 m, 16 bytes of codes; w = d·q + m.
- Q8_0: fp16 d, 32 int8 codes; w = d·q.

In a block's 16 code bytes, the low nibbles are weights 0-15 and the high nibbles weights 16-31.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ALIGNMENT = 32
BLOCK = 32
# GGUF metadata value types -> struct format (8: string and 9: array are read apart)
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
F32, F16, Q4_0, Q4_1, Q8_0 = 0, 1, 2, 3, 8
BLOCK_BYTES = {Q4_0: 2 + 16, Q4_1: 4 + 16, Q8_0: 2 + 32}


class _Cursor:
    def __init__(self, data: memoryview) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> Any:
        (value,) = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += struct.calcsize("<" + fmt)
        return value

    def string(self) -> str:
        length = self.take("Q")
        text = bytes(self.data[self.at : self.at + length]).decode("utf-8", errors="replace")
        self.at += length
        return text

    def value(self, kind: int) -> Any:
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            inner, count = self.take("I"), self.take("Q")
            return [self.value(inner) for _ in range(count)]
        return self.take(SCALARS[kind])


@dataclass
class Tensor:
    shape: tuple[int, ...]  # numpy order: the slowest-varying dimension first
    kind: int
    offset: int


@dataclass
class GGUF:
    metadata: dict[str, Any]
    tensors: dict[str, Tensor]
    data: memoryview = field(repr=False)

    def array(self, name: str) -> np.ndarray:
        """Tensor ``name`` as float32 in its numpy shape (a linear layer's weight: (out, in))."""
        tensor = self.tensors[name]
        count = int(np.prod(tensor.shape))
        if tensor.kind in (F32, F16):
            dtype = np.float32 if tensor.kind == F32 else np.float16
            flat = np.frombuffer(self.data, dtype=dtype, count=count, offset=tensor.offset)
            return flat.astype(np.float32).reshape(tensor.shape)
        if tensor.kind not in BLOCK_BYTES:
            raise ValueError(f"{name}: GGUF tensor type {tensor.kind} is not read here")
        size = BLOCK_BYTES[tensor.kind]
        blocks = np.frombuffer(self.data, dtype=np.uint8, count=count // BLOCK * size, offset=tensor.offset)
        return _dequantize(blocks.reshape(-1, size), tensor.kind).reshape(tensor.shape)


def _dequantize(blocks: np.ndarray, kind: int) -> np.ndarray:
    scale = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    if kind == Q8_0:
        return scale * blocks[:, 2:].copy().view(np.int8).astype(np.float32)
    packed = blocks[:, -16:]
    codes = np.concatenate([packed & 0x0F, packed >> 4], axis=1).astype(np.float32)
    if kind == Q4_0:
        return scale * (codes - 8)
    low = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    return scale * codes + low


def read(path: Path) -> GGUF:
    """The metadata and tensor table of the GGUF file at ``path``; the data stays mapped."""
    data = memoryview(np.memmap(path, dtype=np.uint8, mode="r"))
    cursor = _Cursor(data)
    if bytes(data[:4]) != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    cursor.at = 4
    version = cursor.take("I")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not read here")
    tensor_count, metadata_count = cursor.take("Q"), cursor.take("Q")
    metadata = {}
    for _ in range(metadata_count):
        key = cursor.string()
        metadata[key] = cursor.value(cursor.take("I"))
    table = []
    for _ in range(tensor_count):
        name = cursor.string()
        rank = cursor.take("I")
        dims = [cursor.take("Q") for _ in range(rank)]
        table.append((name, tuple(reversed(dims)), cursor.take("I"), cursor.take("Q")))
    alignment = int(metadata.get("general.alignment", ALIGNMENT))
    start = -(-cursor.at // alignment) * alignment
    tensors = {name: Tensor(shape, kind, start + offset) for name, shape, kind, offset in table}
    return GGUF(metadata, tensors, data)
