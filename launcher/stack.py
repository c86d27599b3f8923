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


def listeners(port: int) -> int | None:
    """TCP sockets listening on `port` on this machine (/proc/net/tcp and tcp6; None where they cannot
    be read). `api.serve` workers listen once they serve, each on a socket of its own."""
    count = 0
    try:
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # 0A: LISTEN
                    count += 1
    except OSError:
        return None
    return count


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

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = (self.log_dir / f"{name}.log").open("ab")
        process = subprocess.Popen(
            argv,
            cwd=ROOT,
            env={**self.env, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes[name] = process
        return process

    def migrate(self) -> None:
        subprocess.run(
            [sys.executable, "-m", "alembic", "-c", str(ROOT / "alembic.ini"), "upgrade", "head"],
            cwd=ROOT,
            env=self.env,
            check=True,
            capture_output=True,
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
    ) -> subprocess.Popen:
        """A Celery worker node ``name@host`` consuming ``queues``; ``env`` adds to the stack's environment.
        It lowers its own CPU priority by ``QUANT_WORKER_NICE`` (10 unless set) as it starts (`worker.app`)."""
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
        return self._spawn(name, argv, env)

    def wait_ready(self, timeout: float = 60.0, workers: int = 1) -> None:
        """Until the API answers /health and all its `workers` listen (each listens once it serves)."""
        deadline = time.monotonic() + timeout
        port = int(str(self.api_url).rsplit(":", 1)[1])
        while time.monotonic() < deadline:
            try:
                healthy = httpx.get(f"{self.api_url}/api/v1/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                healthy = False
            listening = listeners(port) if healthy else None
            if healthy and (listening is None or listening >= workers):
                return
            if self.processes["api"].poll() is not None:
                raise RuntimeError(f"the API exited; see {self.log_dir / 'api.log'}")
            time.sleep(0.2)
        raise TimeoutError(f"the API did not answer within {timeout} s; see {self.log_dir / 'api.log'}")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal a process and everything it started (its session)."""
        process = self.processes.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        process.wait(timeout=30)

    def stop(self) -> None:
        for name in list(self.processes):
            process = self.processes[name]
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=15)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=15)
            self.processes.pop(name)
