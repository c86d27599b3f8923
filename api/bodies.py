"""JSON bodies serialized in the route itself, for reads that only serialize what they read.

FastAPI checks a sync route's return value against its `response_model` in the thread pool, one more
hop (about 60 us of CPU here) after the route's own, then dumps it with pydantic's `dump_json`. A route
that returns `JsonBody(shape)(value)` does the same check and the same one-pass dump (by alias, from
attributes: ORM objects and SQL rows alike) in its own thread. The OpenAPI document still comes from the
route's `response_model`, so it does not change.
"""

from __future__ import annotations

from typing import Any

from fastapi import Response
from pydantic import TypeAdapter


class JsonBody:
    """`JsonBody(Page[JobPublic])(value)`: a 200 `application/json` response with `value` validated as that
    shape and serialized as FastAPI would have; an invalid value raises (a 500, as FastAPI's check would)."""

    def __init__(self, shape: Any) -> None:
        self.adapter: TypeAdapter[Any] = TypeAdapter(shape)

    def __call__(self, value: Any) -> Response:
        validated = self.adapter.validate_python(value, from_attributes=True)
        return Response(self.adapter.dump_json(validated, by_alias=True), media_type="application/json")
