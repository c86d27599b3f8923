"""Wait briefly for a validation task's verdict on an upload (a model, or an image dataset).

The upload route commits a `pending` row, queues the check on the `default` queue, then polls the
row with a growing delay (50 ms up to 0.5 s) until it is `ready` or `invalid`, or until
`validation_wait_seconds` pass; a row still pending then is answered with 202 for the client to poll.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from starlette.concurrency import run_in_threadpool

from jobs.config import Settings
from jobs.models import ModelStatus


class _Checked(Protocol):
    status: ModelStatus


Row = TypeVar("Row", bound=_Checked)


async def wait_for_verdict(settings: Settings, load: Callable[[], Row]) -> Row:
    deadline = time.monotonic() + settings.validation_wait_seconds
    delay = 0.05
    while True:
        row = await run_in_threadpool(load)
        if row.status != ModelStatus.pending or time.monotonic() >= deadline:
            return row
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 0.5)
