"""`/health` (the process answers) and `/ready` (database and broker reachable)."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import text

from api.deps import CeleryDep, SessionDep
from api.problems import Problem
from api.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health, summary="Liveness")
async def health() -> dict:
    # `async def`: it does no I/O, and a sync route costs two thread-pool hops (the call and the check of
    # its return value), most of this route's CPU.
    return {"status": "ok", "database": "unchecked", "broker": "unchecked"}


@router.get(
    "/ready",
    response_model=Health,
    summary="Readiness: database and broker reachable",
    responses={503: {"description": "The database or the broker is unreachable"}},
)
def ready(session: SessionDep, celery: CeleryDep) -> dict:
    try:
        session.execute(text("SELECT 1"))
    except Exception as exc:
        raise Problem(503, f"database unreachable: {type(exc).__name__}", slug="database-unavailable") from exc
    try:
        with celery.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, timeout=2)
    except Exception as exc:
        raise Problem(503, f"broker unreachable: {type(exc).__name__}", slug="broker-unavailable") from exc
    return {"status": "ok", "database": "ok", "broker": "ok"}
