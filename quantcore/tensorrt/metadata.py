"""What an engine was built from and on: the facts stored beside it, because an engine runs only on the
GPU model (or compatibility level) and TensorRT version it was built for.

- ``cuda_status()``: whether a CUDA device is usable, and if not why (torch built without CUDA, no
  device visible). Asking torch initialises the CUDA driver, so call it in the process that builds.
- ``gpu_info()``: name, compute capability, memory, CUDA runtime (torch's), CUDA driver API version
  (``cuDriverGetVersion`` through ctypes) and the NVIDIA kernel driver version (/proc/driver/nvidia).
- ``file_sha256()``: SHA-256 of the ONNX file, streamed (external data files are listed separately).
"""

from __future__ import annotations

import ctypes
import hashlib
import re
from pathlib import Path
from typing import Any

import torch

CHUNK = 1 << 20  # bytes hashed per read


def cuda_status() -> tuple[bool, str | None]:
    """(usable, reason it is not)."""
    if torch.version.cuda is None:
        return False, f"no CUDA: torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return False, "no CUDA device is visible (torch.cuda.is_available() is False)"
    return True, None


def _cuda_driver_version() -> str | None:
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int(0)
        if libcuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
            return None
    except OSError:
        return None
    return f"{version.value // 1000}.{(version.value % 1000) // 10}"  # 12040 -> "12.4"


def _nvidia_driver_version() -> str | None:
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", text)
    return match.group(1) if match else None


def gpu_info(device: int = 0) -> dict[str, Any]:
    """Facts about CUDA device ``device`` (requires ``cuda_status()[0]``)."""
    properties = torch.cuda.get_device_properties(device)
    major, minor = torch.cuda.get_device_capability(device)
    return {
        "index": device,
        "name": properties.name,
        "compute_capability": f"{major}.{minor}",
        "total_memory_bytes": int(properties.total_memory),
        "cuda_runtime": torch.version.cuda,
        "cuda_driver": _cuda_driver_version(),
        "nvidia_driver": _nvidia_driver_version(),
    }


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def external_data_files(model_path: str | Path, locations: list[str]) -> list[dict[str, str]]:
    """``[{"path", "sha256"}]`` of the external data files a model references (relative to it)."""
    directory = Path(model_path).parent
    return [{"path": location, "sha256": file_sha256(directory / location)} for location in sorted(set(locations))]
