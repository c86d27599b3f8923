"""A worker node announces itself in the `workers` table, keeps the row fresh, and removes it at shutdown.

Started from `worker.app` on Celery's ``worker_ready`` signal, in the worker's parent process: the
capability probe runs in a child interpreter (``worker.capabilities``), so CUDA is never initialised
here. Only nodes that consume the `engine` queue are probed; a node is ``engine_capable`` when it
consumes that queue and the probe found CUDA and TensorRT. A node killed without shutdown leaves its
row behind, and the row's heartbeat ages past ``worker_heartbeat_timeout``: readers ignore it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Sequence
from typing import Any

from jobs import workers
from jobs.config import settings
from jobs.db import session_scope
from jobs.queue import ENGINE_QUEUE
from worker.capabilities import probe

log = logging.getLogger(__name__)


class Registration(threading.Thread):
    """Registers node ``name`` and refreshes its heartbeat every ``worker_heartbeat_interval`` seconds."""

    def __init__(self, name: str, queues: Sequence[str]) -> None:
        super().__init__(daemon=True, name=f"registration-{name}")
        self.node = name
        self.queues = sorted(queues)
        self.pid = os.getpid()
        self.stopped = threading.Event()
        self.capabilities: dict[str, Any] | None = None

    def _register(self) -> None:
        if self.capabilities is None:
            if ENGINE_QUEUE in self.queues:
                self.capabilities = probe()
            else:
                self.capabilities = {"engine_capable": False, "reason": f"does not consume the {ENGINE_QUEUE} queue"}
            log.info("worker %s capabilities: %s", self.node, self.capabilities)
            if ENGINE_QUEUE in self.queues and not self.capabilities.get("engine_capable"):
                # A node that cannot build must not take builds meant for one that can.
                log.warning(
                    "worker %s cannot build engines (%s); it stops consuming the %s queue",
                    self.node,
                    self.capabilities.get("reason"),
                    ENGINE_QUEUE,
                )
                from worker.app import app

                app.control.cancel_consumer(ENGINE_QUEUE, destination=[self.node])
        capable = bool(self.capabilities.get("engine_capable"))
        with session_scope(settings.resolved_database_url) as session:
            workers.register_worker(
                session=session,
                name=self.node,
                hostname=socket.gethostname(),
                pid=self.pid,
                queues=self.queues,
                engine_capable=capable,
                reason=None if capable else self.capabilities.get("reason"),
                capabilities=self.capabilities,
            )

    def run(self) -> None:
        registered = False
        while not self.stopped.is_set():
            try:
                if registered:
                    with session_scope(settings.resolved_database_url) as session:
                        registered = workers.touch_worker(session=session, name=self.node, pid=self.pid)
                if not registered:  # first beat, or the row vanished (database restored, name reused)
                    self._register()
                    registered = True
            except Exception:  # a DB blip: try again next beat; the timeout is several beats long
                log.warning("registration of worker %s failed", self.node, exc_info=True)
            self.stopped.wait(settings.worker_heartbeat_interval)

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=5)
        try:
            with session_scope(settings.resolved_database_url) as session:
                workers.remove_worker(session=session, name=self.node, pid=self.pid)
        except Exception:
            log.warning("could not deregister worker %s; its row will age out", self.node, exc_info=True)
