"""Reconstruction (stage 4): AdaRound, BRECQ and QDrop on any ONNX graph the engine quantizes.

``reconstruct(prepared, annotation, calibration, config)`` → ``ReconstructionResult`` whose
``prepared`` (learned weights, on their grids) and ``annotation`` (learned activation scales) are
exported as usual. Modules: ``blocks`` (partition by rules), ``torch_ops`` (the op table and the
per-node support check, with ``shape_ops``, ``normalization_ops``, ``resize_ops`` and ``recurrent_ops``)
and ``converter`` (a block as a differentiable torch module), ``adaround`` (learned rounding), ``cache``
(block inputs and targets in memory or on disk), ``reconstruct`` (the loop).
"""

from quantcore.reconstruction.blocks import Block, partition
from quantcore.reconstruction.reconstruct import BlockReport, ReconstructionResult, reconstruct

__all__ = ["Block", "BlockReport", "ReconstructionResult", "partition", "reconstruct"]
