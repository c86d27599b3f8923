"""Serve the API from several processes, each accepting connections on a listening socket of its own.

    python -m api.serve [--host 127.0.0.1] [--port 8000] [--workers 2] [--log-level warning]
                        [--timeout-graceful-shutdown 30]

uvicorn's own `--workers` share one listening socket, and Linux hands a new connection to the process
that waited on it last: the one that is busiest, since it returns to its event loop most often. Under
keep-alive clients that one worker ends up holding almost every connection (measured with
`bench.load`, 16 clients: one of two workers served 5632 of 6008 reads) and the other core idles
while requests queue. Here every worker binds its own socket to the same address with SO_REUSEPORT,
and the kernel spreads new connections over the sockets by a hash of their addresses.

Each worker also freezes the objects it holds once the app is built (`gc.freeze()`): imported modules,
the app, its routes and validators, some 160 000 objects that live as long as the process. Left to
the cyclic garbage collector, every full collection scans them all, 88 to 131 ms of CPU during which
the worker answers nothing (`bench.request_cpu` prints the figure); frozen, a full collection scans
the few thousand objects created since, well under a millisecond.

The parent binds the sockets and keeps them open; a worker's server starts listening on its socket
only once its app is built and warmed up. The kernel hands a port's connections only to sockets that
listen, so none waits behind a worker that is still starting (and none is lost when that worker is
stopped before it serves: a connection queued on a socket nobody accepts from is reset when the socket
closes). Once listening, a socket stays so while its worker is replaced, and the connections that
arrive meanwhile wait in its queue; it restarts a worker that dies, unless the worker failed to start
(uvicorn's STARTUP_FAILURE status: the app does not import or its lifespan fails), which a restart
would repeat: then it stops, status 1. On SIGTERM or SIGINT it passes SIGTERM to the workers, which
stop accepting and let requests finish for `--timeout-graceful-shutdown` seconds (uvicorn's graceful
shutdown), waits for them, and ends by the same signal, as uvicorn does. With one worker the server
runs in this process.

SO_REUSEPORT would as readily let a second server bind the port beside the first, and the kernel
would split the clients between them. So only this server's own sockets share it: a port that
another process listens on, or another `api.serve` holds (its sockets bound but still starting), is
refused with "address in use: HOST:PORT", status 1 (see `bound_sockets` and `port_lock`).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import gc
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
from dataclasses import dataclass

import uvicorn
from uvicorn.config import STARTUP_FAILURE

from api.warmup import warm_up
from jobs.config import settings
from jobs.logs import configure_logging

APP = "api.main:app"

log = logging.getLogger("api.serve")


@dataclass(frozen=True)
class Options:
    log_level: str = "info"
    graceful_seconds: int = 30
    app: str = APP  # import string of the ASGI app


def bound_sockets(host: str, port: int, count: int) -> list[socket.socket]:
    """`count` TCP sockets bound to (host, port) with SO_REUSEPORT (port 0: a free port, the same for
    all), not yet listening: uvicorn listens on each when its worker starts serving (asyncio's
    ``create_server`` with ``sock=``). OSError EADDRINUSE where another process listens on the port,
    whatever its options: a first socket bound without SO_REUSEPORT (which only our own, not listening
    yet, may share) finds that out, and is closed once ours are bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # SO_REUSEADDR: connections left in TIME_WAIT by a server that ran here before do not count.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
        port = probe.getsockname()[1]
        sockets: list[socket.socket] = []
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            sockets.append(sock)
    return sockets


def port_lock(port: int) -> socket.socket:
    """A lock on `port` for this process: an abstract UNIX socket named after it, which a second
    `api.serve` fails to bind (OSError EADDRINUSE) even while the first one's sockets are bound but do
    not listen yet (`bound_sockets` cannot see those). The kernel releases it when the process ends;
    like ports, such names belong to a network namespace (a container has its own)."""
    lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        lock.bind(f"\0quantservice-api-port-{port}")
    except OSError:
        lock.close()
        raise
    return lock


def serve_on(options: Options, sock: socket.socket) -> None:
    """One uvicorn server on `sock`, until SIGTERM/SIGINT (then graceful shutdown). The app is built and
    warmed up (`api.warmup`) before it accepts a connection; the objects that exist then live as long
    as the process and are frozen out of the cyclic collector (see the module docstring)."""
    config = uvicorn.Config(
        options.app, log_level=options.log_level, timeout_graceful_shutdown=options.graceful_seconds
    )
    config.load()  # imports and builds the app
    asyncio.run(warm_up(config.loaded_app))
    gc.collect()
    gc.freeze()
    uvicorn.Server(config).run(sockets=[sock])


class Supervisor:
    """The worker processes, one per socket; see the module docstring."""

    def __init__(self, options: Options, sockets: list[socket.socket]) -> None:
        self.options = options
        self.sockets = sockets
        self.context = multiprocessing.get_context("spawn")
        self.workers: list[multiprocessing.process.BaseProcess] = []
        self.stop = threading.Event()
        self.signals: list[int] = []

    def _start(self, sock: socket.socket) -> multiprocessing.process.BaseProcess:
        process = self.context.Process(target=serve_on, args=(self.options, sock), name="api-worker")
        process.start()
        log.info("API worker %d serving on %s", process.pid, sock.getsockname())
        return process

    def _on_signal(self, sig: int, _frame: object) -> None:
        self.signals.append(sig)
        self.stop.set()

    def run(self) -> int:
        handlers = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        self.workers = [self._start(sock) for sock in self.sockets]
        status = 0
        while not self.stop.wait(0.5):
            for index, process in enumerate(self.workers):
                if process.is_alive():
                    continue
                process.join()
                if process.exitcode == STARTUP_FAILURE:
                    log.error("API worker %d failed to start; stopping", process.pid)
                    status = 1
                    self.stop.set()
                    break
                log.error("API worker %d died (status %s); starting another", process.pid, process.exitcode)
                self.workers[index] = self._start(self.sockets[index])
        for process in self.workers:
            if process.is_alive():
                os.kill(process.pid, signal.SIGTERM)  # a second SIGTERM (killpg) is harmless to uvicorn
        for process in self.workers:
            process.join()
        for sock in self.sockets:
            sock.close()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        if self.signals:  # end as uvicorn does: by the signal that stopped it, once shutdown is done
            signal.signal(self.signals[-1], signal.SIG_DFL)
            signal.raise_signal(self.signals[-1])
        return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1, help="processes, each with its own listening socket")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--timeout-graceful-shutdown", type=int, default=30, dest="graceful_seconds")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    configure_logging(settings)  # the supervisor's own lines, in the format the workers' app uses
    options = Options(args.log_level, args.graceful_seconds)
    try:
        sockets = bound_sockets(args.host, args.port, args.workers)
        lock = port_lock(sockets[0].getsockname()[1])
    except OSError as error:
        if error.errno != errno.EADDRINUSE:
            raise
        print(f"api.serve: address in use: {args.host}:{args.port}", file=sys.stderr)
        return 1
    with lock:
        if args.workers == 1:
            serve_on(options, sockets[0])
            return 0
        return Supervisor(options, sockets).run()


if __name__ == "__main__":
    sys.exit(main())
