"""The bench's GGUF reader (``bench.models.gguf``) and byte-level BPE (``bench.models.smollm.Tokenizer``) on
files and vocabularies built here, byte by byte from the format's layout, with values chosen so that every
dequantized weight is known exactly."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from bench.models.gguf import F32, Q4_0, Q4_1, Q8_0, read
from bench.models.smollm import Tokenizer


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _block(kind: int, codes: np.ndarray, d: float, m: float = 0.0) -> bytes:
    """One block of 32 weights: fp16 d (and m for Q4_1), then the codes (4-bit ones packed low nibbles
    first: weights 0-15 in the low halves of the 16 bytes, 16-31 in the high ones)."""
    head = np.float16(d).tobytes() + (np.float16(m).tobytes() if kind == Q4_1 else b"")
    if kind == Q8_0:
        return head + codes.astype(np.int8).tobytes()
    return head + (codes[:16] | (codes[16:] << 4)).astype(np.uint8).tobytes()


def _write(path: Path, tensors: dict[str, tuple[tuple[int, ...], int, bytes]], metadata: bytes, count: int) -> None:
    table, data = b"", b""
    for name, (shape, kind, raw) in tensors.items():
        data += b"\0" * (-len(data) % 32)
        dims = b"".join(struct.pack("<Q", d) for d in reversed(shape))
        table += _string(name) + struct.pack("<I", len(shape)) + dims + struct.pack("<IQ", kind, len(data))
        data += raw
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), count) + metadata + table
    path.write_bytes(head + b"\0" * (-len(head) % 32) + data)


def test_reads_metadata_and_dequantizes_each_block_type(tmp_path: Path) -> None:
    codes = np.concatenate([np.arange(16), (np.arange(16) * 7) % 16])  # halves differ: nibble order shows
    signed = np.arange(32) - 16
    floats = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensors = {
        "f32": ((2, 3), F32, floats.tobytes()),
        "q4_0": ((1, 32), Q4_0, _block(Q4_0, codes, 0.5)),
        "q4_1": ((2, 32), Q4_1, _block(Q4_1, codes, 0.25, -1.0) + _block(Q4_1, codes[::-1].copy(), 2.0, 3.0)),
        "q8_0": ((32,), Q8_0, _block(Q8_0, signed, 0.125)),
    }
    metadata = (
        _string("llama.block_count") + struct.pack("<II", 4, 30)
        + _string("names") + struct.pack("<IIQ", 9, 8, 2) + _string("a b") + _string("c")
        + _string("eps") + struct.pack("<If", 6, 1e-5)
    )  # fmt: skip
    _write(tmp_path / "model.gguf", tensors, metadata, 3)
    gguf = read(tmp_path / "model.gguf")
    assert gguf.metadata["llama.block_count"] == 30 and gguf.metadata["names"] == ["a b", "c"]
    assert abs(gguf.metadata["eps"] - 1e-5) < 1e-12
    np.testing.assert_array_equal(gguf.array("f32"), floats)
    np.testing.assert_array_equal(gguf.array("q4_0"), 0.5 * (codes - 8)[None, :])
    expected = np.stack([0.25 * codes - 1.0, 2.0 * codes[::-1] + 3.0])
    np.testing.assert_array_equal(gguf.array("q4_1"), expected)
    np.testing.assert_array_equal(gguf.array("q8_0"), 0.125 * signed)


def test_bpe_applies_merges_by_rank_over_bytes() -> None:
    tokens = ["h", "e", "l", "o", "Ġ", "he", "ll", "hell", "hello", "Ġh", "Ġhe", "Ġhell", "Ġhello", "Ã", "©", "Ã©"]
    # by rank: " hello" becomes Ġh (rank 0) before h and e can merge (rank 2), then Ġhe, ll, Ġhell, Ġhello
    merges = ["Ġ h", "Ġh e", "h e", "l l", "he ll", "Ġhe ll", "hell o", "Ġhell o", "Ã ©"]
    tokenizer = Tokenizer(tokens, merges)
    ids = {t: i for i, t in enumerate(tokens)}
    assert tokenizer.encode("hello hello") == [ids["hello"], ids["Ġhello"]]
    assert tokenizer.encode("hel") == [ids["he"], ids["l"]]  # "l l" has no second l to merge with
    assert tokenizer.encode("é") == [ids["Ã©"]]  # é is the bytes c3 a9, written Ã © in the byte alphabet
