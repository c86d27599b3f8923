"""What every stage driver of ``quantize`` is handed: the run's inputs, as the caller gave them, and the
stage protocol (cancel check, start and end progress, wall-clock seconds per stage)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from quantcore.progress import Monitor


class StageClock:
    """Runs the stage protocol: ``begin`` polls ``should_cancel`` and reports the stage started; ``end``
    records its wall-clock seconds and reports it done with ``message``. A stage that raises never ends:
    it has no seconds and no 1.0 progress."""

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor
        self.seconds: dict[str, float] = {}  # stage → seconds, rounded to ms, in the order the stages ended

    def begin(self, stage: str) -> float:
        """Raise ``Canceled(stage)`` if asked to stop, else report ``(stage, 0.0)``; returns the start time."""
        self.monitor.check(stage)
        self.monitor.report(stage, 0.0, f"{stage} started")
        return time.perf_counter()

    def end(self, stage: str, started: float, message: str) -> None:
        """Record the seconds since ``started`` for ``stage`` and report ``(stage, 1.0, message)``."""
        self.seconds[stage] = round(time.perf_counter() - started, 3)
        self.monitor.report(stage, 1.0, message)


@dataclass(frozen=True)
class Run:
    """``quantize``'s arguments that every stage reads, unchanged: ``model_path`` as given (str or Path),
    the calibration and evaluation arrays (``{input name: array}``), the optional (N_eval,) labels and
    (N_calibration,) ``calibration_labels`` (QAT's label loss), ``out_dir`` (created), the two callbacks in
    ``monitor``, and the clock every stage reports through."""

    model_path: str | Path
    calibration: Mapping[str, np.ndarray]
    evaluation: Mapping[str, np.ndarray]
    labels: np.ndarray | None
    out_dir: Path
    monitor: Monitor
    clock: StageClock  # over ``monitor``
    calibration_labels: np.ndarray | None = None
