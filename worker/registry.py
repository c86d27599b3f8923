"""A worker node announces itself in the `workers` table, keeps the row fresh, and removes it at shutdown.

The keeper runs as a small process of its own, ``python -m worker.registry``, started by `worker.app` on
Celery's ``worker_ready`` signal and stopped (SIGTERM: it deregisters) on ``worker_shutdown``. Not a
thread of the worker's parent: the parent forks pool processes at any time, and a database connection
in use across a fork breaks (SQLite's WAL locks are tracked per process, a PostgreSQL socket would be
shared), and CUDA must never be initialised there either. The keeper exits by itself when the worker
it speaks for is gone (SIGKILL included), leaving a row whose heartbeat ages past
``worker_heartbeat_timeout``, which readers ignore.

Only nodes consuming the `engine` queue are probed (``worker.capabilities``). A node is
``engine_capable`` when it consumes that queue and the probe found CUDA and TensorRT; a node that
consumes it without being able to build is told to stop consuming it.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any

from jobs import workers
from jobs.config import settings
from jobs.db import session_scope
from jobs.queue import ENGINE_QUEUE

log = logging.getLogger(__name__)


def start(node: str, queues: Sequence[str]) -> subprocess.Popen:
    """Start the keeper of node ``node`` (called in the worker's parent process)."""
    argv = [sys.executable, "-m", "worker.registry", node, ",".join(sorted(queues)), str(os.getpid())]
    return subprocess.Popen(argv)


def stop(keeper: subprocess.Popen) -> None:
    keeper.terminate()
    try:
        keeper.wait(timeout=10)
    except subprocess.TimeoutExpired:
        keeper.kill()


def _capabilities(node: str, queues: Sequence[str]) -> dict[str, Any]:
    if ENGINE_QUEUE not in queues:
        return {"engine_capable": False, "reason": f"does not consume the {ENGINE_QUEUE} queue"}
    from worker.capabilities import probe

    found = probe()
    log.info("worker %s capabilities: %s", node, found)
    if not found.get("engine_capable"):
        # A node that cannot build must not take builds meant for one that can.
        log.warning(
            "worker %s cannot build engines (%s); it stops consuming %s", node, found.get("reason"), ENGINE_QUEUE
        )
        from worker.app import app

        try:
            app.control.cancel_consumer(ENGINE_QUEUE, destination=[node])
        except Exception:  # a transport without broadcast (the embedded filesystem broker)
            log.exception("could not stop worker %s consuming %s; builds it takes will be left", node, ENGINE_QUEUE)
    return found


def keep(node: str, queues: Sequence[str], pid: int, stopped: threading.Event) -> None:
    """Register node ``node`` (worker parent ``pid``) and beat until ``stopped`` or the parent is gone."""
    found = _capabilities(node, queues)
    capable = bool(found.get("engine_capable"))
    registered = False
    while not stopped.is_set() and os.getppid() == pid:
        try:
            with session_scope(settings.resolved_database_url) as session:
                if registered:
                    registered = workers.touch_worker(session=session, name=node, pid=pid)
                if not registered:  # first beat, or the row vanished (database restored, name reused)
                    workers.register_worker(
                        session=session,
                        name=node,
                        hostname=socket.gethostname(),
                        pid=pid,
                        queues=queues,
                        engine_capable=capable,
                        reason=None if capable else found.get("reason"),
                        capabilities=found,
                    )
                    registered = True
        except Exception:  # a DB blip: try again next beat; the timeout is several beats long
            log.warning("registration of worker %s failed", node, exc_info=True)
        stopped.wait(settings.worker_heartbeat_interval)
    if stopped.is_set():
        with session_scope(settings.resolved_database_url) as session:
            workers.remove_worker(session=session, name=node, pid=pid)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m worker.registry", description=__doc__.splitlines()[0])
    parser.add_argument("node", help="the Celery node name, e.g. gpu0@host")
    parser.add_argument("queues", help="comma-separated queues the node consumes")
    parser.add_argument("pid", type=int, help="the worker's parent process")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s: %(levelname)s/registry] %(message)s")
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    signal.signal(signal.SIGINT, lambda *_: stopped.set())
    keep(args.node, args.queues.split(","), args.pid, stopped)


if __name__ == "__main__":
    main()
