"""The Celery application the workers run: `celery -A worker.app worker -Q gpu` (and `-Q default`).

Configuration (queues, acks_late, prefetch 1, time limits) is shared with the API in `jobs.queue`.
Importing this module imports no torch and touches no GPU: CUDA is initialised only inside the
pool process that runs a job. A worker lowers its CPU priority by `QUANT_WORKER_NICE` when it starts
(before its pool processes are forked, so they and their threads inherit it).
"""

from __future__ import annotations

import logging
import os

from celery.signals import setup_logging, worker_init, worker_process_init, worker_ready, worker_shutdown

from jobs.config import settings
from jobs.logs import configure_logging
from jobs.queue import make_celery

app = make_celery(settings)
app.conf.imports = ("worker.tasks",)
log = logging.getLogger(__name__)
_registration = None  # the process keeping this node's `workers` row (worker.registry)


@setup_logging.connect
def _logging(**_kwargs) -> None:
    # Connected, so Celery leaves the root logger to us: JSON or text as the settings say, job ids included.
    configure_logging(settings)


def yield_cpu(increment: int) -> int:
    """Add `increment` to this process's niceness (Linux caps it at 19); returns the niceness now in
    force. Relative, as `nice -n` is: a worker started beside the API, both under `nice -n 10`, still
    runs below it. On Linux it applies to the calling thread and to the threads and processes it
    starts from then on."""
    return os.nice(increment) if increment > 0 else os.nice(0)


@worker_init.connect
def _yield_cpu_on_start(**_kwargs) -> None:
    # In the worker's main process, before the pool forks: a job's quantization (every pool process and
    # the torch / ONNX Runtime threads it starts) then runs below an API sharing this host's cores.
    niceness = yield_cpu(settings.worker_nice)
    log.info("worker running at niceness %d (QUANT_WORKER_NICE=%d)", niceness, settings.worker_nice)


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
    # Announce this node and what it can build, from a process of its own (see worker.registry).
    global _registration
    from worker.registry import start

    _registration = start(sender.hostname, sender.app.amqp.queues.consume_from)


@worker_shutdown.connect
def _deregister_on_shutdown(sender, **_kwargs) -> None:
    if _registration is not None:
        from worker.registry import stop

        stop(_registration)


@worker_process_init.connect
def _own_connections(**_kwargs) -> None:
    # A forked pool process must not reuse the parent's pooled connections (the reaper ran there at start):
    # a PostgreSQL socket or SQLite file handle used from two processes corrupts protocol and lock state.
    # Drop the inherited pool without closing what the parent owns.
    from jobs.db import get_engine

    get_engine(settings.resolved_database_url).dispose(close=False)
