"""`.npz` uploads read from their headers (`jobs.npz`): each header held to the bytes behind it, the
archive's decompressed size and compression ratio capped. No services needed; test_api.py checks the
same through the real API."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest

from jobs.config import Settings
from jobs.npz import InvalidArchive, inspect_npz, npz_limits

LIMITS = npz_limits(Settings(max_dataset_arrays=8, max_dataset_expanded_bytes=1024 * 1024, max_dataset_ratio=100))


def npy_with_shape(shape: tuple[int, ...], data: bytes) -> bytes:
    """An .npy whose header declares `shape` (float32) whatever `data` holds."""
    buffer = io.BytesIO()
    header = {"descr": "<f4", "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(buffer, header)
    return buffer.getvalue() + data


def write_zip(path: Path, members: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def test_a_header_must_match_the_data_behind_it(tmp_path: Path) -> None:
    forged = write_zip(tmp_path / "f.npz", {"x.npy": npy_with_shape((1_000_000_000, 4), b"\0" * 64)})
    declared = r"array 'x' declares shape \[1000000000, 4\] of float32 .* holds 64 bytes"
    with pytest.raises(InvalidArchive, match=declared):
        inspect_npz(forged, limits=LIMITS)
    short = write_zip(tmp_path / "s.npz", {"y.npy": npy_with_shape((4, 4), b"\0" * 60)})
    with pytest.raises(InvalidArchive, match="array 'y' declares shape"):
        inspect_npz(short, limits=LIMITS)
    exact = write_zip(tmp_path / "e.npz", {"z.npy": npy_with_shape((4, 4), b"\0" * 64)})
    assert inspect_npz(exact, limits=LIMITS).num_samples == 4


def test_a_zip_bomb_is_refused_by_ratio_and_by_expanded_size(tmp_path: Path) -> None:
    zeros = io.BytesIO()
    np.save(zeros, np.zeros(200_000, np.float32))  # 800 kB, deflates ~1000:1
    bomb = write_zip(tmp_path / "b.npz", {"x.npy": zeros.getvalue()}, zipfile.ZIP_DEFLATED)
    with pytest.raises(InvalidArchive, match=r"compression ratio of [0-9]+:1 \(at most 100:1\)"):
        inspect_npz(bomb, limits=LIMITS)
    big = io.BytesIO()
    np.save(big, np.random.default_rng(0).normal(size=300_000).astype(np.float32))  # 1.2 MB, barely compresses
    too_big = write_zip(tmp_path / "t.npz", {"big.npy": big.getvalue()}, zipfile.ZIP_DEFLATED)
    with pytest.raises(InvalidArchive, match=r"member 'big\.npy' expands to 1200128 bytes; at most 1048576"):
        inspect_npz(too_big, limits=LIMITS)


def test_a_constant_mask_beside_real_data_passes_and_counts_decompressed(tmp_path: Path) -> None:
    # The ratio is taken over the archive: an all-ones mask alone compresses ~1000:1.
    rng = np.random.default_rng(0)
    arrays = {"x": rng.normal(size=(64, 512)).astype(np.float32), "mask": np.ones((64, 512), np.int8)}
    np.savez_compressed(tmp_path / "d.npz", **arrays)
    listing = inspect_npz(tmp_path / "d.npz", limits=LIMITS)
    assert [a["name"] for a in listing.arrays] == ["x", "mask"]
    header = 128  # np.save pads each header to a multiple of 64 bytes
    assert listing.expanded_bytes == sum(a.nbytes + header for a in arrays.values())
    assert listing.expanded_bytes > (tmp_path / "d.npz").stat().st_size
