"""Cursor pagination shared by the list routes: `?limit=&cursor=` in, `{items, next_cursor}` out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Query

from api.problems import Problem
from jobs.cursors import InvalidCursor

LimitQuery = Annotated[int, Query(ge=1, le=200, description="Items per page.")]
CursorQuery = Annotated[str | None, Query(description="`next_cursor` of the previous page.")]


def page(list_rows: Callable[..., tuple[list, str | None]], **kwargs: Any) -> dict:
    try:
        items, next_cursor = list_rows(**kwargs)
    except InvalidCursor as exc:
        raise Problem(400, str(exc), slug="invalid-cursor") from exc
    return {"items": items, "next_cursor": next_cursor}
