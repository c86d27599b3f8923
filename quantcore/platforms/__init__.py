"""Platform rule sets, by the name ``QuantizeConfig.platform`` uses."""

from __future__ import annotations

from quantcore.platforms.tensorrt import TENSORRT
from quantcore.rules import Platform

PLATFORMS: dict[str, Platform] = {
    TENSORRT.name: TENSORRT,
}

__all__ = ["PLATFORMS", "Platform"]
