"""The storage sweep (beat, every `storage_sweep_interval`): remove what a crash left in the store.

A crash between storing an object and committing the row that names it (an upload before its row, a
job's staged artifacts before its end) leaves an object no reader can reach; so does an upload cut
off mid-stream on an object store (an incomplete multipart upload, billed but invisible). Objects
older than `storage_sweep_grace_seconds` that no row needs (`jobs.orphans`) are deleted, and such
multipart uploads aborted.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from itertools import islice

from jobs import orphans, storage
from jobs.config import settings
from jobs.db import session_scope

log = logging.getLogger(__name__)

BATCH = 500  # keys per SQL question


@dataclass(frozen=True)
class SweepResult:
    deleted: list[str]
    aborted_uploads: int


def sweep(now: float | None = None) -> SweepResult:
    store = storage.open_store(settings)
    cutoff = (time.time() if now is None else now) - settings.storage_sweep_grace_seconds
    old = (
        stored.key
        for stored in store.list()
        if stored.modified < cutoff and not stored.key.startswith(".work/")  # a local store's job work dirs
    )
    deleted: list[str] = []
    while keys := list(islice(old, BATCH)):
        uploads = [key for key in keys if key.startswith(f"{storage.UPLOADS}/")]
        with session_scope(settings.resolved_database_url) as session:
            found = orphans.orphaned(session=session, keys=keys)
        for key in uploads + found:
            store.delete(key)
        deleted += uploads + found
    aborted = store.abort_stale_uploads(cutoff)
    if deleted or aborted:
        log.info("storage sweep: %d orphaned objects deleted, %d multipart uploads aborted", len(deleted), aborted)
    return SweepResult(deleted, aborted)
