"""`python -m launcher` as a process: a signal that stops it stops every process it started first; a port
another API instance holds is refused rather than taken for its own API's."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from launcher.stack import ROOT, Stack, free_port

START_SECONDS = 180  # migrations, two Celery workers and the API on two shared, busy cores
MARK = "QUANT_TEST_LAUNCHER"  # in the environment of the launcher, so of every process it starts


def marked(mark: str) -> dict[int, str]:
    """The live processes whose environment holds MARK=mark: pid -> command line. Found by their
    environment, not their parent: orphans are reparented, and may have left the launcher's tree."""
    found = {}
    needle = f"\0{MARK}={mark}\0".encode()
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "Z" and needle in b"\0" + (proc / "environ").read_bytes():
                found[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    return found


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout} s")
        time.sleep(0.2)


def logged_at(log: Path, text: bytes = b"") -> datetime:
    """When the first line of ``log`` that holds ``text`` and starts with the service's timestamp was logged."""
    for line in log.read_bytes().splitlines():
        if text in line and re.match(rb"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", line):
            return datetime.strptime(line[:23].decode(), "%Y-%m-%d %H:%M:%S,%f")
    raise AssertionError(f"no timestamped line holding {text!r} in {log}")


@pytest.fixture
def launcher_env(tmp_path: Path) -> dict[str, str]:
    """`make run`'s environment, with a storage root, an SQLite database and a filesystem broker of its
    own (no Redis database shared with other test runs)."""
    return dict(
        os.environ,
        QUANT_VAR_DIR=str(tmp_path / "var"),
        DATABASE_URL=f"sqlite:///{tmp_path / 'quant.db'}",
        BROKER_URL="filesystem://",
    )


@dataclass
class Launcher:
    process: subprocess.Popen
    mark: str
    out: Path


@contextlib.contextmanager
def launcher(env: dict[str, str], out: Path, *args: str) -> Iterator[Launcher]:
    """`python -m launcher` with its output to `out`; whatever of it and of the processes it started is
    alive afterwards is killed, so that a failing test leaves none behind."""
    mark = uuid.uuid4().hex
    with out.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "launcher", *args],
            cwd=ROOT,
            env=dict(env, **{MARK: mark}),
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield Launcher(process, mark, out)
    finally:
        for pid in marked(mark):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait(timeout=30)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_stops_every_process_the_launcher_started(
    launcher_env: dict[str, str], tmp_path: Path, signum: int
) -> None:
    logs = tmp_path / "var" / "logs"
    with launcher(launcher_env, tmp_path / "launcher.out", "--port", str(free_port())) as run:
        process = run.process
        wait_for(lambda: b"API:" in run.out.read_bytes() or process.poll() is not None, START_SECONDS, "API")
        assert process.poll() is None, run.out.read_text()
        for worker in ("gpu", "default"):  # each with its pool process once it is ready
            log = logs / f"{worker}.log"
            wait_for(lambda log=log: log.exists() and b" ready." in log.read_bytes(), START_SECONDS, "worker")
        # on the filesystem broker the second worker starts once the first is ready (kombu's exchange files)
        assert logged_at(logs / "gpu.log", b" ready.") <= logged_at(logs / "default.log")
        commands = " | ".join(marked(run.mark).values())
        assert "api.serve" in commands and commands.count("celery") >= 4, commands  # 2 mains, 2 pools
        os.kill(process.pid, signum)
        # The launcher's stop grace (35 s) bounds this, even with the sample job running.
        assert process.wait(timeout=60) == -signum, run.out.read_text()
        assert marked(run.mark) == {}
        assert "Traceback" not in run.out.read_text()


def test_a_port_another_instance_serves_is_refused(launcher_env: dict[str, str], tmp_path: Path) -> None:
    """Another instance's /health answers on the port too: the launcher must not take it for its own
    API (which `api.serve` refuses to start there), nor leave its workers running."""
    other_env = dict(launcher_env, QUANT_VAR_DIR=str(tmp_path / "other"), DATABASE_URL=f"sqlite:///{tmp_path / 'o.db'}")
    other = Stack(env=other_env, log_dir=tmp_path / "other-logs")
    try:
        other.migrate()
        port = other.start_api().rsplit(":", 1)[1]
        with launcher(launcher_env, tmp_path / "launcher.out", "--port", port, "--once") as run:
            status = run.process.wait(timeout=START_SECONDS)
            text = run.out.read_text()
            assert status == 1, text
            assert f"address in use: 127.0.0.1:{port}" in text and "API:" not in text, text
            assert marked(run.mark) == {}
        assert other.processes["api"].poll() is None  # the first instance is untouched
    finally:
        other.stop()
