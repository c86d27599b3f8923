"""The Celery application the workers run: `celery -A worker.app worker -Q gpu` (and `-Q default`).

Configuration (queues, acks_late, prefetch 1, time limits) is shared with the API in `jobs.queue`.
Importing this module imports no torch and touches no GPU: CUDA is initialised only inside the
pool process that runs a job.
"""

from __future__ import annotations

import logging

from celery.signals import setup_logging, worker_ready

from jobs.config import settings
from jobs.logs import configure_logging
from jobs.queue import make_celery

app = make_celery(settings)
app.conf.imports = ("worker.tasks",)
log = logging.getLogger(__name__)


@setup_logging.connect
def _logging(**_kwargs) -> None:
    # Connected, so Celery leaves the root logger to us: JSON or text as the settings say, job ids included.
    configure_logging(settings)


@worker_ready.connect
def _reap_on_start(sender, **_kwargs) -> None:
    # A worker that comes back after a crash recovers what its predecessor left running.
    from worker.reaper import reap

    try:
        reap(app)
    except Exception:
        log.exception("reaper failed at worker start")
