"""Read what an `.npz` holds (names, dtypes, shapes) from its headers, without loading data.

Object arrays are refused: loading them would unpickle, which runs code from the upload. Which axis
counts samples depends on the model an array feeds (a recurrent state ``(2, N, 128)`` batches along
axis 1, a scalar sample rate is one value for all samples), so an upload is not checked for one
sample count: a job checks its dataset against its model's batch axes (`jobs.dataset_fit`).

A job's worker loads every array whole, so the archive is checked as image archives are
(`jobs.archives.checked_members`: member count, size once decompressed, compression ratio) and each
header is held to the bytes behind it: ``prod(shape) * itemsize`` must equal the member's declared
size less its header, or a 64-byte member could claim a billion samples.
"""

from __future__ import annotations

import math
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from jobs.archives import ArchiveLimits, checked_members, open_zip

if TYPE_CHECKING:
    from jobs.config import Settings

_HEADER_READERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


class InvalidArchive(ValueError):
    pass


@dataclass(frozen=True)
class NpzListing:
    arrays: list[dict[str, Any]]  # [{name, dtype, shape}]
    # The length of the first axis when every array that has axes agrees on it, else None (samples
    # are then counted per model input by a job).
    num_samples: int | None
    expanded_bytes: int  # every member decompressed: what a job's worker holds


def npz_limits(settings: Settings) -> ArchiveLimits:
    return ArchiveLimits(
        max_files=settings.max_dataset_arrays,
        max_file_bytes=settings.max_dataset_expanded_bytes,
        max_total_bytes=settings.max_dataset_expanded_bytes,
        max_ratio=settings.max_dataset_ratio,
        ratio_over="archive",
    )


def inspect_npz(path: Path, *, limits: ArchiveLimits) -> NpzListing:
    """List the archive's arrays from their headers; raises `InvalidArchive` naming the array or cap."""
    if not zipfile.is_zipfile(path):
        raise InvalidArchive("not an .npz archive (a zip of .npy files)")
    arrays: list[dict[str, Any]] = []
    expanded = 0
    with open_zip(path, limits.max_files, InvalidArchive) as archive:
        for member in checked_members(archive, limits, InvalidArchive):
            if not member.filename.endswith(".npy") or "/" in member.filename:
                raise InvalidArchive(f"unexpected member '{member.filename}': an .npz holds only top-level .npy files")
            arrays.append(_read_header(archive, member))
            expanded += member.file_size
    if not arrays:
        raise InvalidArchive("the archive holds no arrays")
    leading = {a["shape"][0] for a in arrays if a["shape"]}
    if not leading:
        raise InvalidArchive("every array is a scalar; at least one must hold samples")
    return NpzListing(arrays, leading.pop() if len(leading) == 1 else None, expanded)


def _read_header(archive: zipfile.ZipFile, member: zipfile.ZipInfo) -> dict[str, Any]:
    name = member.filename[: -len(".npy")]
    with archive.open(member) as handle:
        try:
            version = np.lib.format.read_magic(handle)
            read_header = _HEADER_READERS.get(version)
            if read_header is None:
                raise ValueError(f"unsupported .npy format version {version}")
            shape, _fortran, dtype = read_header(handle)
        except (ValueError, OSError) as exc:
            raise InvalidArchive(f"array '{name}' has no valid .npy header: {exc}") from exc
        data_bytes = member.file_size - handle.tell()
    if dtype.hasobject:
        raise InvalidArchive(f"array '{name}' holds Python objects; only numeric arrays are accepted")
    shape = [int(d) for d in shape]
    declared = math.prod(shape) * dtype.itemsize  # Python ints: a forged shape cannot overflow
    if declared != data_bytes:
        raise InvalidArchive(
            f"array '{name}' declares shape {shape} of {dtype.name} ({declared} bytes) "
            f"but holds {data_bytes} bytes of data"
        )
    return {"name": name, "dtype": dtype.name, "shape": shape}
