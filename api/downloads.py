"""Artifact downloads with Range refusals as problem+json.

Starlette's `FileResponse` answers a malformed Range (400) and one past the end of the file (416)
itself, in plain text or with no body, from inside its own `__call__`. It parses the header in one
classmethod; overriding it turns those refusals into `Problem`s, which the route's exception
handling (`api.problems`) sends like every other error, before any byte of the file goes out.
"""

from __future__ import annotations

from fastapi.responses import FileResponse
from starlette.responses import MalformedRangeHeader, RangeNotSatisfiable

from api.problems import Problem

RANGE_FIELD = "header.range"  # as FastAPI names a header in validation errors


class ArtifactResponse(FileResponse):
    @classmethod
    def _parse_range_header(cls, http_range: str, file_size: int) -> list[tuple[int, int]]:
        try:
            return super()._parse_range_header(http_range, file_size)
        except MalformedRangeHeader as exc:
            message = exc.content.removeprefix("Range header: ")
            raise Problem(
                400,
                f"malformed Range header: {message}",
                slug="bad-range",
                errors=[{"field": RANGE_FIELD, "message": message}],
            ) from exc
        except RangeNotSatisfiable as exc:
            message = f"the range starts past the end of the file ({exc.max_size} bytes)"
            raise Problem(
                416,
                message,
                slug="range-not-satisfiable",
                errors=[{"field": RANGE_FIELD, "message": message}],
                headers={"Content-Range": f"bytes */{exc.max_size}"},
            ) from exc
