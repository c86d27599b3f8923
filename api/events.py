"""Server-Sent Events of a job, read from the job_events table (the DB is the source of truth).

Polls for rows after the last id sent, so any API process can serve any client and a client that
reconnects with `Last-Event-ID` gets exactly what it missed. Ends after the terminal status event.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

from starlette.concurrency import run_in_threadpool

from api.schemas import EventPublic
from jobs import queries
from jobs.db import session_scope
from jobs.models import TERMINAL_STATUSES

POLL_SECONDS = 0.5
KEEPALIVE_SECONDS = 15.0


def _fetch(url: str, job_id: uuid.UUID, after: int) -> tuple[list[dict], bool]:
    with session_scope(url) as session:
        rows = queries.events_after(session=session, job_id=job_id, after_id=after)
        events = [EventPublic.model_validate(row).model_dump(mode="json") for row in rows]
        if events:  # the caller only needs `ended` when there was nothing new to send
            return events, False
        job = queries.get_job_unscoped(session=session, job_id=job_id)
        ended = job is None or job.status in TERMINAL_STATUSES
    return events, ended


def _is_terminal(event: dict) -> bool:
    status = (event.get("data") or {}).get("status")
    return event["kind"] == "status" and status in {s.value for s in TERMINAL_STATUSES}


def format_event(event: dict) -> str:
    return f"id: {event['id']}\nevent: {event['kind']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n"


async def stream_events(url: str, job_id: uuid.UUID, after: int) -> AsyncIterator[str]:
    yield "retry: 2000\n\n"
    last_sent = time.monotonic()
    while True:
        events, ended = await run_in_threadpool(_fetch, url, job_id, after)
        for event in events:
            after = event["id"]
            yield format_event(event)
            last_sent = time.monotonic()
            if _is_terminal(event):
                return
        if ended and not events:
            # The terminal event was sent before the client's Last-Event-ID: nothing more will come.
            return
        if time.monotonic() - last_sent > KEEPALIVE_SECONDS:
            yield ": keep-alive\n\n"
            last_sent = time.monotonic()
        await asyncio.sleep(POLL_SECONDS)
