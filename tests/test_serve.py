"""`api.serve`: API workers with a listening socket each, so that connections spread over them; a dead
worker is replaced; a worker that cannot start stops the server instead of restarting forever; a
second server on the same port is refused; the warm-up a worker runs before serving."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from api.serve import Options, Supervisor, bound_sockets, port_lock
from api.warmup import warm_up
from launcher.stack import Stack

CONNECTIONS = 32
# Each connection lands on one of two sockets by a hash of its addresses: fewer than 4 of 32 on one
# worker has a probability of 2 * 5489 / 2**32 (about 3e-6) if the kernel spreads them evenly; with one
# socket shared by both workers, a single worker took 94 % of bench.load's connections.
MIN_PER_WORKER = 4


@pytest.fixture
def api(tmp_path: Path):
    env = dict(
        os.environ,
        DATABASE_URL=f"sqlite:///{tmp_path / 'api.db'}",
        QUANT_VAR_DIR=str(tmp_path / "var"),
        QUANT_ENVIRONMENT="test",
        BROKER_URL="redis://127.0.0.1:1/0",  # not used by /health
    )
    stack = Stack(env=env, log_dir=tmp_path / "logs")
    stack.migrate()
    url = stack.start_api(workers=2)
    try:
        yield stack, url
    finally:
        stack.stop()


def health_on_new_connections(url: str, count: int) -> list[int]:
    """Open `count` connections at once, one GET /health on each (kept open until all have answered);
    returns the HTTP statuses."""
    host, port = url.removeprefix("http://").split(":")
    connections = [socket.create_connection((host, int(port)), timeout=30) for _ in range(count)]
    statuses = []
    try:
        for connection in connections:
            connection.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: api\r\n\r\n")
        for connection in connections:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = connection.recv(4096)
                if not chunk:
                    break
                head += chunk
            statuses.append(int(head.split(b" ", 2)[1]))
    finally:
        for connection in connections:
            connection.close()
    return statuses


def settled_size(log: Path, quiet: float = 0.5) -> int:
    """The log's size once it has not grown for `quiet` seconds (an access line is written after its
    response has gone)."""
    size = log.stat().st_size
    while True:
        time.sleep(quiet)
        if (now := log.stat().st_size) == size:
            return size
        size = now


def health_lines_by_worker(log: Path, after: int) -> dict[int, int]:
    counts: dict[int, int] = {}
    for pid in re.findall(rb"api\.access \[(\d+)\] GET /api/v1/health 200", log.read_bytes()[after:]):
        counts[int(pid)] = counts.get(int(pid), 0) + 1
    return counts


def worker_pids(parent: int) -> set[int]:
    """The supervisor's worker processes (spawned by multiprocessing; not its resource tracker)."""
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    return {int(pid) for pid in children if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()}


def wait_dead(pid: int, timeout: float = 10.0) -> None:
    """Until `pid` is a zombie or gone."""
    deadline = time.monotonic() + timeout
    status = Path(f"/proc/{pid}/status")
    while time.monotonic() < deadline:
        try:
            if "\nState:\tZ" in status.read_text():
                return
        except FileNotFoundError:
            return
        time.sleep(0.01)
    raise TimeoutError(f"process {pid} still alive {timeout} s after SIGKILL")


def test_connections_spread_over_both_workers(api) -> None:
    stack, url = api
    log = stack.log_dir / "api.log"
    offset = settled_size(log)  # after the start-up probes' access lines
    assert health_on_new_connections(url, CONNECTIONS) == [200] * CONNECTIONS
    time.sleep(0.5)  # the access lines are written after the response
    served = health_lines_by_worker(log, offset)
    assert sum(served.values()) == CONNECTIONS, served
    assert len(served) == 2 and min(served.values()) >= MIN_PER_WORKER, served


def test_a_killed_worker_is_replaced_and_no_connection_is_refused(api) -> None:
    stack, url = api
    parent = stack.processes["api"].pid
    before = worker_pids(parent)
    assert len(before) == 2, before
    os.kill(min(before), signal.SIGKILL)
    wait_dead(min(before))  # until then it may still accept a connection, which its death resets
    # Connections hashed to the dead worker's socket wait in its queue (the parent keeps it open) until
    # the replacement accepts them: every one is answered.
    assert health_on_new_connections(url, CONNECTIONS) == [200] * CONNECTIONS
    after = worker_pids(parent)
    assert len(after) == 2 and min(before) not in after and max(before) in after, (before, after)


def serve_to_exit(port: int, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`python -m api.serve --workers 2` on `port`, until it exits; one that serves instead is killed
    with its workers after 30 s (its start-up takes a few)."""
    argv = [sys.executable, "-m", "api.serve", "--port", str(port), "--workers", "2", "--log-level", "warning"]
    server = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = server.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        stdout, stderr = server.communicate()
    return subprocess.CompletedProcess(argv, server.returncode, stdout, stderr)


def test_a_second_server_on_the_port_is_refused_and_the_first_serves_every_client(api) -> None:
    """SO_REUSEPORT would let the second bind beside the first, and the kernel would hand it some of the
    clients (14 of 20, once, to an instance with another database)."""
    stack, url = api
    port = int(url.rsplit(":", 1)[1])
    second = serve_to_exit(port, stack.env)
    assert (second.returncode, second.stderr.strip()) == (1, f"api.serve: address in use: 127.0.0.1:{port}")
    log = stack.log_dir / "api.log"
    offset = settled_size(log)
    assert health_on_new_connections(url, CONNECTIONS) == [200] * CONNECTIONS
    settled_size(log)
    served = health_lines_by_worker(log, offset)
    assert sum(served.values()) == CONNECTIONS and set(served) <= worker_pids(stack.processes["api"].pid), served


def test_a_port_another_server_is_still_starting_on_is_refused(tmp_path: Path) -> None:
    """The first server's sockets are bound but do not listen until its workers serve: what refuses the
    second then is the first one's `port_lock`."""
    (first,) = bound_sockets("127.0.0.1", 0, 1)
    port = first.getsockname()[1]
    try:
        with port_lock(port):
            second = serve_to_exit(port, dict(os.environ, DATABASE_URL=f"sqlite:///{tmp_path / 'api.db'}"))
    finally:
        first.close()
    assert (second.returncode, second.stderr.strip()) == (1, f"api.serve: address in use: 127.0.0.1:{port}")


def test_a_worker_failing_at_start_up_stops_the_server() -> None:
    sockets = bound_sockets("127.0.0.1", 0, 2)
    started = time.monotonic()
    status = Supervisor(Options(log_level="warning", app="tests.no_such_module:app"), sockets).run()
    assert status == 1
    assert time.monotonic() - started < 60  # it stopped, it did not restart the workers forever
    with pytest.raises(OSError):
        sockets[0].getsockname()  # closed


def test_warm_up_runs_the_request_path_without_a_key_or_data(tmp_path: Path) -> None:
    """What a worker sends itself before serving: liveness answers, the job listing refuses the missing
    key (after routing and dependency solving), and nothing reaches the database (which is not there)."""
    from api.main import create_app
    from jobs.config import Settings

    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'absent' / 'db.sqlite'}", environment="test"))
    # In a thread of its own, as in a fresh worker: an earlier test (Playwright's) may leave this one's
    # event loop marked running.
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(asyncio.run, warm_up(app)).result() == [200, 401]
    assert not (tmp_path / "absent" / "db.sqlite").exists()  # never connected


def test_connections_go_only_to_sockets_that_listen() -> None:
    """Why a starting worker loses no connection: of two sockets bound to the port, the kernel hands
    every connection to the one that listens (as `api.serve` workers do once they serve); before, a
    connection hashed to a starting worker waited on its socket and was reset if that worker was
    stopped before serving (test_shutdown's SIGTERM test failed so in one of this session's two CI runs)."""
    from launcher.stack import listeners

    ready, starting = bound_sockets("127.0.0.1", 0, 2)
    port = ready.getsockname()[1]
    try:
        assert listeners(port) == []
        ready.listen(64)
        assert listeners(port) == [os.fstat(ready.fileno()).st_ino]
        clients = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(CONNECTIONS)]
        ready.settimeout(5)
        accepted = [ready.accept()[0] for _ in range(CONNECTIONS)]
        starting.listen(64)  # only now may connections reach it: none is queued there
        starting.setblocking(False)
        with pytest.raises(BlockingIOError):
            starting.accept()
        for connection in clients + accepted:
            connection.close()
    finally:
        ready.close()
        starting.close()
