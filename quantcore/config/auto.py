"""Options of ``strategy="auto"``: the search's budget, objective and candidates (``quantcore.auto``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from quantcore.checks import require_choice, require_range, string_tuple
from quantcore.config.analysis import AccuracyTarget
from quantcore.config.choices import AUTO_BUDGET_SECONDS, AUTO_CANDIDATES


@dataclass(frozen=True)
class AutoOptions:
    """What ``strategy="auto"`` may try and spend (``quantcore.auto``).

    budget_seconds: wall-clock seconds for the search and the final run with the chosen config together,
    in [10, 86400]: the final run's estimate, its analysis included, is held back while candidates run
    (``quantcore.auto.budget``); a candidate that cannot finish with its final run is stopped, the first
    (the config as given) too, whose final run then runs unscored, so only a budget below the final run of
    the config as given alone (or an engine build, not estimated) is exceeded.
    objective: the accuracy a candidate must reach on the selection split (an ``AccuracyTarget``, its
    ``max_float_layers`` bounding the fallback search); default: the worst float output's cosine to FP32
    >= 0.99. candidates: names from ``AUTO_CANDIDATES`` to try, in that list's order whatever the order
    given; None: every one that applies to the platform.
    """

    budget_seconds: float = 900.0
    objective: AccuracyTarget = field(default_factory=lambda: AccuracyTarget("cosine", 0.99))
    candidates: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        require_range("auto.budget_seconds", self.budget_seconds, *AUTO_BUDGET_SECONDS)
        object.__setattr__(self, "budget_seconds", float(self.budget_seconds))
        if not isinstance(self.objective, AccuracyTarget):
            raise ValueError(f"auto.objective must be an AccuracyTarget, got {self.objective!r}")
        if self.candidates is not None:
            names = string_tuple("auto.candidates", self.candidates)
            for name in names:
                require_choice("auto.candidates", name, AUTO_CANDIDATES)
            if not names:
                raise ValueError("auto.candidates must name at least one candidate (None: all that apply)")
            object.__setattr__(self, "candidates", names)

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget_seconds": self.budget_seconds,
            "objective": self.objective.to_dict(),
            "candidates": None if self.candidates is None else list(self.candidates),
        }
