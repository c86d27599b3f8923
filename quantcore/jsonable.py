"""Plain JSON values only, for the report and every JSON file quantcore writes.

``jsonable`` converts numpy scalars and arrays, tuples and paths to JSON types and turns NaN/±inf
into None, so ``json.dumps(report, allow_nan=False)`` always succeeds. Undefined metrics (the SQNR
of a perfect match, a cosine against an all-zero output) are None, never a stand-in number.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

import numpy as np


def jsonable(value: Any) -> Any:
    """``value`` as nested dict/list/str/int/float/bool/None, non-finite floats as None."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value) if isinstance(value, (set, frozenset)) else value
        return [jsonable(v) for v in items]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, PurePath):
        return str(value)
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"not JSON-serializable: {type(value).__name__}")
