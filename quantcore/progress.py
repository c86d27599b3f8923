"""Progress reporting and cooperative cancellation, shared by every stage.

``progress(stage, fraction, message)``: ``fraction`` is the stage's own completion in [0, 1]
(0.0 at its start, 1.0 at its end, per batch in between for calibrate and evaluate).
``should_cancel()`` is polled between stages and between batches; True raises ``Canceled(stage)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from quantcore.errors import Canceled

ProgressCallback = Callable[[str, float, str], None]
CancelCheck = Callable[[], bool]


@dataclass(frozen=True)
class Monitor:
    """The two optional callbacks, bundled; every method is a no-op when its callback is None."""

    progress: ProgressCallback | None = None
    should_cancel: CancelCheck | None = None

    def report(self, stage: str, fraction: float, message: str) -> None:
        if self.progress is not None:
            self.progress(stage, min(1.0, max(0.0, float(fraction))), message)

    def check(self, stage: str) -> None:
        """Raise ``Canceled(stage)`` if the caller asked to stop."""
        if self.should_cancel is not None and self.should_cancel():
            raise Canceled(stage)
