"""Exceptions raised by quantcore.

The tree::

    QuantcoreError                 base of everything quantcore raises on purpose
    ├── InvalidModelError          the file is not a usable ONNX model (parse, checker, opset range,
    │                              external data outside the model's directory)
    ├── UnsupportedModelError      a valid model that this engine cannot quantize (already quantized,
    │                              opset conversion failed, unsupported bit width for export)
    ├── InvalidDataError           calibration/evaluation arrays do not fit the model (missing or unknown
    │                              input name, shape, sample count, non-finite values, labels)
    └── Canceled                   the caller's ``should_cancel()`` returned True

Configuration mistakes made in code (a bad ``QuantizeConfig`` value) raise plain ``ValueError`` at
construction, because they are programming errors rather than properties of user input.
Every message names the offending input, tensor, file or field.
"""

from __future__ import annotations


class QuantcoreError(Exception):
    """Base class for every error quantcore raises deliberately."""


class InvalidModelError(QuantcoreError):
    """The model file cannot be parsed, fails the ONNX checker, or is otherwise unusable."""


class UnsupportedModelError(QuantcoreError):
    """The model is valid ONNX but this engine cannot quantize it."""


class InvalidDataError(QuantcoreError):
    """Calibration, evaluation or label arrays do not match the model's inputs."""


class Canceled(QuantcoreError):
    """The run was canceled through ``should_cancel``; ``stage`` says where it stopped."""

    def __init__(self, stage: str) -> None:
        super().__init__(f"canceled during stage {stage!r}")
        self.stage = stage
