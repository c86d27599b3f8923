"""Where a run's torch work (reconstruction, QAT) trains; its ONNX Runtime sessions' side is
``quantcore.runtime.session.session_device``.

``QuantizeConfig.device`` names one of three: ``cpu``; ``cuda`` (torch on the GPU and ONNX Runtime on its
CUDA EP, an error where either has no CUDA); ``auto`` (torch on the GPU where torch sees one, else on the
CPU; ONNX Runtime on its CPU EP). ``auto`` is what a worker asks for: it trains on whatever the host has,
while the calibration, evaluation and parity sessions keep running on the CPU EP, the EP the report's
figures and the deployed-model checks are defined on, whatever ONNX Runtime build the host has installed.
"""

from __future__ import annotations

import torch


def torch_device(device: str) -> torch.device:
    """The torch device a run with ``QuantizeConfig.device`` = ``device`` trains on. Raises ValueError for
    ``cuda`` where torch sees no CUDA device."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch sees no CUDA device")
    return torch.device(device)
