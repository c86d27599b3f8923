"""Keyset pagination for every list endpoint: newest first on (created_at, id).

A cursor is the URL-safe base64 of the last row's ``created_at|id``; the next page holds the rows
strictly older than it, so pages stay stable while new rows are added (no offset drift).
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, or_
from sqlalchemy.orm import Session


class InvalidCursor(ValueError):
    """A `cursor` query parameter this API did not hand out."""


def encode_cursor(created_at: datetime, row_id: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(f"{created_at.isoformat()}|{row_id}".encode()).decode()


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        created, row_id = base64.urlsafe_b64decode(cursor.encode()).decode().split("|")
        return datetime.fromisoformat(created), uuid.UUID(row_id)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidCursor("cursor is not one this API returned") from exc


def paginate(*, session: Session, query: Any, entity: Any, limit: int, cursor: str | None) -> tuple[list, str | None]:
    """Newest first, keyset pagination on (created_at, id): stable while rows are added."""
    if cursor:
        created_at, row_id = decode_cursor(cursor)
        query = query.where(
            or_(entity.created_at < created_at, and_(entity.created_at == created_at, entity.id < row_id))
        )
    rows = session.scalars(query.order_by(entity.created_at.desc(), entity.id.desc()).limit(limit + 1)).all()
    return cut_page(rows, limit)


def cut_page(rows: Sequence[Any], limit: int) -> tuple[list, str | None]:
    """The first `limit` of up to `limit + 1` rows read newest first, and the cursor to the rest (None when
    there is none). Rows are anything with `created_at` and `id`: ORM objects or SQL rows."""
    if len(rows) <= limit:
        return list(rows), None
    page = list(rows[:limit])
    return page, encode_cursor(page[-1].created_at, page[-1].id)
