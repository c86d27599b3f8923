"""Read what an `.npz` holds (names, dtypes, shapes) from its headers, without loading data.

Object arrays are refused: loading them would unpickle, which runs code from the upload. Which axis
counts samples depends on the model an array feeds (a recurrent state ``(2, N, 128)`` batches along
axis 1, a scalar sample rate is one value for all samples), so an upload is not checked for one
sample count: a job checks its dataset against its model's batch axes (`jobs.dataset_fit`).
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np

_HEADER_READERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


class InvalidArchive(ValueError):
    pass


def inspect_npz(path: Path, *, max_arrays: int) -> tuple[list[dict[str, Any]], int | None]:
    """Return ([{name, dtype, shape}], num_samples): the length of the first axis when every array that
    has axes agrees on it, else None (samples are then counted per model input by a job)."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise InvalidArchive("not an .npz archive (a zip of .npy files)") from exc
    arrays: list[dict[str, Any]] = []
    with archive:
        members = [m for m in archive.infolist() if not m.is_dir()]
        if not members:
            raise InvalidArchive("the archive holds no arrays")
        if len(members) > max_arrays:
            raise InvalidArchive(f"the archive holds {len(members)} files; at most {max_arrays} are allowed")
        for member in members:
            if not member.filename.endswith(".npy") or "/" in member.filename or "\\" in member.filename:
                raise InvalidArchive(f"unexpected member '{member.filename}': an .npz holds only top-level .npy files")
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
            if dtype.hasobject:
                raise InvalidArchive(f"array '{name}' holds Python objects; only numeric arrays are accepted")
            arrays.append({"name": name, "dtype": dtype.name, "shape": [int(d) for d in shape]})
    leading = {a["shape"][0] for a in arrays if a["shape"]}
    if not leading:
        raise InvalidArchive("every array is a scalar; at least one must hold samples")
    return arrays, leading.pop() if len(leading) == 1 else None
