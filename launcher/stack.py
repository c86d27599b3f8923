"""A set of service processes sharing one environment (database, broker, storage root)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


# Grace period of `Stack.stop`: longer than the API's graceful shutdown (30 s unless
# `start_api` is told otherwise), so that requests still being answered are not cut short.
STOP_GRACE_SECONDS = 35.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Stopped(Exception):
    """A signal that stops the launcher (SIGTERM, SIGINT, SIGHUP) arrived; `signum` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StartError(RuntimeError):
    """A service process did not start; the message says why, in one line."""


def listeners(port: int) -> list[int] | None:
    """The inodes of the TCP sockets listening on `port` on this machine, any address (/proc/net/tcp
    and tcp6; None where they cannot be read). `api.serve` workers listen once they serve, each on a
    socket of its own."""
    inodes = []
    try:
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()  # sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # 0A: LISTEN
                    inodes.append(int(fields[9]))
    except OSError:
        return None
    return inodes


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process `pid` holds open (none once it has exited)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(int(target.removeprefix("socket:[").removesuffix("]")))
    return inodes


def session_members(session: int) -> list[int]:
    """The live processes of a session (zombies left out: they have exited), from /proc."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses.
            state, _ppid, _pgrp, sid = stat.read_text().rsplit(")", 1)[1].split()[:4]
            if int(sid) == session and state != "Z":
                members.append(int(stat.parent.name))
    return members


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Stack:
    env: dict[str, str]
    log_dir: Path
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    api_url: str | None = None
    # Set by `raise_on_signals`: while `_holding`, a stop signal is only noted in `_pending`.
    _holding: bool = field(default=False, init=False, repr=False)
    _pending: int | None = field(default=None, init=False, repr=False)

    def raise_on_signals(self) -> None:
        """From now on SIGTERM, SIGINT and SIGHUP raise `Stopped` in the main thread (so that the caller's
        `finally: stack.stop()` runs), once: later ones are only noted, and a second Ctrl-C cannot cut
        `stop` short. While a process is being started, the signal waits until it is in `processes`."""
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self._holding:
            self._pending = self._pending or signum
            return
        self._holding = True
        raise Stopped(signum)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None, **output) -> subprocess.Popen:
        """`argv` in a session of its own (so that `stop` reaches all it starts) as `processes[name]`;
        its output to `log_dir/name.log` unless `output` gives Popen's stdout and stderr."""
        held, self._holding = self._holding, True
        try:
            with contextlib.ExitStack() as files:
                if not output:
                    self.log_dir.mkdir(parents=True, exist_ok=True)
                    log = files.enter_context((self.log_dir / f"{name}.log").open("ab"))  # the child has a copy
                    output = {"stdout": log, "stderr": subprocess.STDOUT}
                process = subprocess.Popen(
                    argv, cwd=ROOT, env={**self.env, **(env or {})}, text=True, start_new_session=True, **output
                )
            self.processes[name] = process
            return process
        finally:
            self._holding = held
            if not held and self._pending is not None:
                self._holding = True
                raise Stopped(self._pending)

    def run(
        self,
        name: str,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        capture: bool = False,
        check: bool = True,
    ) -> subprocess.CompletedProcess:
        """`argv` to its end (`env` added to the stack's), its output to this terminal (`capture`:
        returned as text instead), like `subprocess.run`; meanwhile it is `processes[name]`, so that
        `stop` stops it with the rest if a stop signal interrupts the wait. `check`: a non-zero status
        raises CalledProcessError."""
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE} if capture else {"stdout": None}
        process = self._spawn(name, argv, env, **pipes)
        stdout, stderr = process.communicate()
        del self.processes[name]
        if check and process.returncode != 0:
            raise subprocess.CalledProcessError(process.returncode, argv, stdout, stderr)
        return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)

    def migrate(self) -> None:
        self.run(
            "migrate",
            [sys.executable, "-m", "alembic", "-c", str(ROOT / "alembic.ini"), "upgrade", "head"],
            capture=True,
        )

    def start_api(self, port: int | None = None, workers: int = 1, graceful_seconds: int = 30) -> str:
        """The API on `port` (`api.serve`: `workers` uvicorn processes, each with its own listening socket);
        on SIGTERM it stops accepting, lets requests finish for `graceful_seconds`
        (event streams included), then closes what is left. Its processes share one fresh
        PROMETHEUS_MULTIPROC_DIR so /metrics sums their upload counters."""
        port = port or free_port()
        metrics_dir = Path(self.env.get("QUANT_VAR_DIR", "var")).resolve() / "prometheus" / f"api-{port}"
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(parents=True)
        self._spawn(
            "api",
            [
                sys.executable,
                "-m",
                "api.serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                str(workers),
                "--log-level",
                "warning",
                "--timeout-graceful-shutdown",
                str(graceful_seconds),
            ],
            env=dict(self.env, PROMETHEUS_MULTIPROC_DIR=str(metrics_dir)),
        )
        self.api_url = f"http://127.0.0.1:{port}"
        self.wait_ready(workers=workers)
        return self.api_url

    def start_worker(
        self,
        name: str,
        queues: str,
        *,
        concurrency: int = 1,
        beat: bool = False,
        env: dict[str, str] | None = None,
        wait: bool = False,
    ) -> subprocess.Popen:
        """A Celery worker node ``name@host`` consuming ``queues``; ``env`` adds to the stack's environment.
        It lowers its own CPU priority by ``QUANT_WORKER_NICE`` (10 unless set) as it starts (`worker.app`).
        With ``wait``, returns once the worker logs that it is ready (its queues and mailbox bound)."""
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "worker.app",
            "worker",
            "-Q",
            queues,
            "-c",
            str(concurrency),
            "--prefetch-multiplier",
            "1",
            "-n",
            f"{name}@%h",
            "--loglevel",
            "INFO",
            "--without-gossip",
            "--without-mingle",
        ]
        if beat:
            schedule = Path(self.env.get("QUANT_VAR_DIR", "var")) / f"beat-{name}.db"
            argv += ["-B", "-s", str(schedule)]
        if not wait:
            return self._spawn(name, argv, env)
        log = self.log_dir / f"{name}.log"
        start = log.stat().st_size if log.exists() else 0  # the log is appended to: earlier runs' lines stay
        process = self._spawn(name, argv, env)
        self._wait_logged(name, log, start, b" ready.")
        return process

    def _wait_logged(self, name: str, log: Path, start: int, text: bytes, timeout: float = 180.0) -> None:
        """Until ``log`` holds ``text`` past byte ``start``; StartError if process ``name`` exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with log.open("rb") as file:
                file.seek(start)
                if text in file.read():
                    return
            if self.processes[name].poll() is not None:
                raise StartError(f"the {name} worker exited as it started (see {log})")
            time.sleep(0.2)
        raise TimeoutError(f"the {name} worker was not ready within {timeout} s; see {log}")

    def wait_ready(self, timeout: float = 60.0, workers: int = 1) -> None:
        """Until the API answers /health and all its `workers` listen (each listens once it serves).
        Another process listening on the port (another instance: it would answer /health too) raises
        StartError, as does the API's exit."""
        deadline = time.monotonic() + timeout
        port = int(str(self.api_url).rsplit(":", 1)[1])
        api = self.processes["api"]
        while time.monotonic() < deadline:
            try:
                healthy = httpx.get(f"{self.api_url}/api/v1/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                healthy = False
            listening = listeners(port)
            ours = socket_inodes(api.pid)  # after `listening`: a socket of ours listening then is still open
            if api.poll() is not None:
                log = self.log_dir / "api.log"
                last = (log.read_text(errors="replace").strip().splitlines() or ["(no output)"])[-1]
                raise StartError(f"the API exited: {last} (see {log})")
            if listening is not None and set(listening) - ours:
                raise StartError(f"address in use: 127.0.0.1:{port} (another process listens there)")
            if healthy and (listening is None or len(listening) >= workers):
                return
            time.sleep(0.2)
        raise TimeoutError(f"the API did not answer within {timeout} s; see {self.log_dir / 'api.log'}")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal a process and everything it started (its session)."""
        process = self.processes.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        process.wait(timeout=30)

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """SIGTERM to every process and all it started (its session), all at once; whatever of them is
        left `grace` seconds later (or once its leader has exited: a worker's pool, say) gets SIGKILL.
        Stop signals are only noted from now on."""
        self._holding = True
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(session_members(p.pid) for p in self.processes.values()):
            time.sleep(0.05)
        for name, process in list(self.processes.items()):
            # While a session has a member, no new session can take its id: these are its own.
            for pid in session_members(process.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            process.wait()
            del self.processes[name]
