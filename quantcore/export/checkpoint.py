"""Checkpoint of a finished export, so a run that stopped afterwards resumes without redoing it.

After export, ``quantize`` writes ``checkpoint.json`` (atomically, after the files it lists) into its
output directory::

    {"format": 2, "stage": "export", "fingerprint": <sha256 hex>,
     "files": {<name>: <sha256 hex>, ...}, "export": {counts, opset, warnings},
     "percentile_search": <the clip stage's choice, or null>, "calibration_seconds": <the calibrate stage's>}

The fingerprint is SHA-256 over the configuration (``QuantizeConfig.to_dict()`` as sorted JSON), the
source model's bytes, and every calibration array's name, dtype, shape and bytes: the inputs that
determine calibration and export. A later run reuses the checkpoint only when its fingerprint is equal
and every listed file exists with the recorded digest; otherwise it recomputes (and overwrites). The
calibrate stage's seconds go with it: the place stage's timing budget is a share of them.
Nothing here knows about jobs, queues or databases: the caller decides which directory to resume from.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from quantcore import atomic
from quantcore.annotate.annotation import Annotation
from quantcore.config import QuantizeConfig
from quantcore.export.qdq import ExportResult
from quantcore.numerics.tqc import QuantState, TensorQuantConfig

CHECKPOINT_FILE = "checkpoint.json"
FORMAT = 2  # 2: calibration_seconds
CHUNK = 1 << 20


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def fingerprint(model_path: Path, calibration: Mapping[str, np.ndarray], config: QuantizeConfig) -> str:
    """SHA-256 of what calibration and export depend on (see the module docstring)."""
    digest = hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True, default=str).encode())
    digest.update(_file_digest(Path(model_path)).encode())
    for name in sorted(calibration):
        array = np.ascontiguousarray(calibration[name])
        digest.update(f"{name}|{array.dtype.str}|{array.shape}".encode())
        digest.update(memoryview(array).cast("B"))
    return digest.hexdigest()


def save(
    out_dir: Path,
    key: str,
    exported: ExportResult,
    percentile_search: Mapping[str, Any] | None,
    calibration_seconds: float,
) -> Path:
    """Record ``exported`` (whose files are already complete in ``out_dir``) under ``key``, with the clip
    stage's choice (``quantcore.calibrate.clip_search``) when it ran: a resumed run goes on with that percentile.
    """
    document: dict[str, Any] = {
        "format": FORMAT,
        "stage": "export",
        "fingerprint": key,
        "files": {path.name: _file_digest(path) for path in exported.files},
        "export": {
            "model": exported.model_path.name,
            "tqc": exported.tqc_path.name,
            "quantize_linear_nodes": exported.quantize_linear_nodes,
            "dequantize_linear_nodes": exported.dequantize_linear_nodes,
            "opset": exported.opset,
            "warnings": list(exported.warnings),
        },
        "percentile_search": None if percentile_search is None else dict(percentile_search),
        "calibration_seconds": calibration_seconds,
    }
    path = out_dir / CHECKPOINT_FILE
    atomic.write_json(path, document)
    return path


@dataclass(frozen=True)
class Restored:
    """What a valid checkpoint gives back: the export, the clip stage's choice (None: none ran), and the
    calibrate stage's seconds."""

    exported: ExportResult
    percentile_search: dict[str, Any] | None
    calibration_seconds: float


def load(resume_from: Path, out_dir: Path, key: str) -> Restored | None:
    """The export recorded in ``resume_from`` when it matches ``key`` and its files are intact, copied
    into ``out_dir`` if that is another directory; None when there is nothing valid to reuse."""
    try:
        document = json.loads((resume_from / CHECKPOINT_FILE).read_text())
    except (OSError, ValueError):
        return None
    if document.get("format") != FORMAT or document.get("fingerprint") != key:
        return None
    files: dict[str, str] = document["files"]
    for name, digest in files.items():
        source = resume_from / name
        if not source.is_file() or _file_digest(source) != digest:
            return None
    if resume_from.resolve() != out_dir.resolve():
        for name in files:  # copied under a temporary name, then renamed: never a half-copied file
            partial = out_dir / f".{name}.tmp-resume"
            shutil.copyfile(resume_from / name, partial)
            os.replace(partial, out_dir / name)
    recorded = document["export"]
    exported = ExportResult(
        model_path=out_dir / recorded["model"],
        tqc_path=out_dir / recorded["tqc"],
        files=tuple(out_dir / name for name in files),
        quantize_linear_nodes=recorded["quantize_linear_nodes"],
        dequantize_linear_nodes=recorded["dequantize_linear_nodes"],
        opset=recorded["opset"],
        warnings=tuple(recorded["warnings"]),
    )
    return Restored(exported, document.get("percentile_search"), float(document["calibration_seconds"]))


def restore_configs(annotation: Annotation, tqc_path: Path) -> Annotation:
    """``annotation`` (as annotated, before calibration) with every tensor's calibrated config read back
    from the ``tqc.json`` the checkpointed export wrote: what ``calibrate`` returned in that run. The
    export stores weights as BAKED; in the calibrated annotation they are ACTIVATED, as here. Raises
    ``ValueError`` when the table does not cover exactly the annotated tensors (a different annotation).
    """
    tensors: dict[str, dict[str, Any]] = json.loads(Path(tqc_path).read_text())["tensors"]
    if set(tensors) != set(annotation.configs):
        raise ValueError(f"{tqc_path.name} does not describe this annotation's tensors")
    configs = {}
    for name, entry in tensors.items():
        if name in annotation.parameters and entry["state"] == QuantState.BAKED.value:
            entry = {**entry, "state": QuantState.ACTIVATED.value}
        configs[name] = TensorQuantConfig.from_dict(entry)
    return replace(annotation, configs=configs)
