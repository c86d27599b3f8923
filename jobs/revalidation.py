"""Uploads whose validation never reported: find them, record a re-send, or give up on them.

A model (or image dataset) is `pending` from its upload until its validation task records a verdict.
When that task's message is lost, nothing else would ever decide it; the reaper (`worker.reaper`)
uses these queries to send the message again, at most `validation_max_attempts` times in all, and
then to mark the row invalid. Keyword-only, like `jobs.queries`; nothing here commits.

Every write is a compare-and-set on (`status` = pending, `validation_attempts`): a verdict recorded
meanwhile, or a second reaper that got there first, makes it a no-op that returns False.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from jobs.models import Dataset, Model, ModelStatus, utcnow

Upload = type[Model] | type[Dataset]


def overdue_validations(
    *, session: Session, entity: Upload, older_than: float, limit: int = 1000
) -> list[tuple[uuid.UUID, int]]:
    """(id, validation_attempts) of the pending rows whose last validation message went out more than
    `older_than` seconds ago (the upload's own at `created_at` when none was re-sent), oldest first."""
    cutoff = utcnow() - timedelta(seconds=older_than)
    last_sent = func.coalesce(entity.validation_sent_at, entity.created_at)
    rows = session.execute(
        select(entity.id, entity.validation_attempts)
        .where(entity.status == ModelStatus.pending, last_sent < cutoff)
        .order_by(last_sent)
        .limit(limit)
    )
    return [(row_id, attempts) for row_id, attempts in rows]


def note_validation_resent(*, session: Session, entity: Upload, row_id: uuid.UUID, attempts: int) -> bool:
    """Count one more validation message for a row still pending after `attempts` of them, and restart
    its clock; the caller sends the message after commit. False when decided or counted meanwhile."""
    return _compare_and_set(
        session=session,
        entity=entity,
        row_id=row_id,
        attempts=attempts,
        values={"validation_attempts": attempts + 1, "validation_sent_at": utcnow()},
    )


def give_up_validation(*, session: Session, entity: Upload, row_id: uuid.UUID, attempts: int) -> bool:
    """Mark a row that `attempts` validation messages did not decide invalid, saying so in its error.
    False when a verdict (or another reaper) got there first."""
    return _compare_and_set(
        session=session,
        entity=entity,
        row_id=row_id,
        attempts=attempts,
        values={
            "status": ModelStatus.invalid,
            "error": f"validation did not complete after {attempts} attempts (each task was lost or "
            "stopped before recording a verdict); upload the file again",
        },
    )


def _compare_and_set(
    *, session: Session, entity: Upload, row_id: uuid.UUID, attempts: int, values: dict[str, object]
) -> bool:
    result = session.execute(
        update(entity)
        .where(
            entity.id == row_id,
            entity.status == ModelStatus.pending,
            entity.validation_attempts == attempts,
        )
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    return result.rowcount == 1
