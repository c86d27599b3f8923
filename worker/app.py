"""The Celery application the workers run: `celery -A worker.app worker -Q gpu` (and `-Q default`).

Configuration (queues, acks_late, prefetch 1, time limits) is shared with the API in `jobs.queue`.
Importing this module imports no torch and touches no GPU: CUDA is initialised only inside the
pool process that runs a job.
"""

from __future__ import annotations

import logging

from celery.signals import worker_ready, worker_shutdown

from jobs.config import settings
from jobs.queue import make_celery

app = make_celery(settings)
app.conf.imports = ("worker.tasks",)
log = logging.getLogger(__name__)
_registration = None  # this node's `workers` row keeper (worker.registry), in the parent process only


@worker_ready.connect
def _reap_on_start(sender, **_kwargs) -> None:
    # A worker that comes back after a crash recovers what its predecessor left running.
    from worker.reaper import reap

    try:
        reap(app)
    except Exception:
        log.exception("reaper failed at worker start")


@worker_ready.connect
def _register_on_start(sender, **_kwargs) -> None:
    # Announce this node and what it can build (the GPU probe runs in a child process, never here).
    global _registration
    from worker.registry import Registration

    _registration = Registration(sender.hostname, sender.app.amqp.queues.consume_from)
    _registration.start()


@worker_shutdown.connect
def _deregister_on_shutdown(sender, **_kwargs) -> None:
    if _registration is not None:
        _registration.stop()
