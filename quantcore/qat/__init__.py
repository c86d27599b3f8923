"""QAT (stage qat): the whole quantized graph trained by distillation from its FP32 self.

``qat(prepared, annotation, calibration, config)`` → ``QatResult`` whose ``prepared`` (trained weights,
on their grids) and ``annotation`` (trained scales) are exported as usual. Modules: ``graph_module``
(the graph as a torch module with learnable weights and scales, extending reconstruction's converter
from blocks to the whole graph), ``distillation`` (output kinds, the loss, the held-out metric),
``checkpoint`` (the loop's state saved every N steps and resumed from), ``training`` (the loop).
"""

from quantcore.qat.training import EpochReport, QatResult, qat

__all__ = ["EpochReport", "QatResult", "qat"]
