"""How counts read in the messages quantcore writes for people (progress, verdicts, the report)."""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` and ``noun`` in agreement: ``counted(1, "layer")`` is "1 layer", ``counted(3, "layer")``
    "3 layers"; ``plural`` where adding an s is wrong (``counted(2, "sweep")``, ``counted(2, "axis", "axes")``)."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"
