"""The run report as a JSON document: its format name (values made JSON-safe by ``quantcore.jsonable``)."""

from __future__ import annotations

REPORT_FORMAT = "quantcore.report/1"
