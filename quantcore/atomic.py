"""Atomic file writes: write under a temporary name in the destination directory, then
``os.replace`` (atomic on POSIX within one filesystem). A reader never sees a half-written file and an
interrupted run leaves only a ``.tmp-*`` file behind, never a truncated artifact."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import onnx

from quantcore.graph.protobuf import fits_in_protobuf


def write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json(path: Path, document: Any) -> None:
    """Strict JSON (NaN/inf refused), indented, UTF-8."""
    write_bytes(path, (json.dumps(document, indent=2, allow_nan=False, ensure_ascii=False) + "\n").encode())


def save_model(model: onnx.ModelProto, path: Path) -> list[Path]:
    """Save ``model`` at ``path``; beyond the protobuf limit its tensors go to ``<name>.data`` beside it.
    Returns the files written (the model first)."""
    if fits_in_protobuf(model):
        write_bytes(path, model.SerializeToString())
        return [path]
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)  # saving with external data rewrites tensors in place
        data_name = f"{path.name}.data"
        onnx.save_model(copy, str(staging / path.name), save_as_external_data=True, location=data_name)
        os.replace(staging / data_name, path.parent / data_name)
        os.replace(staging / path.name, path)
        return [path, path.parent / data_name]
    finally:
        shutil.rmtree(staging, ignore_errors=True)
