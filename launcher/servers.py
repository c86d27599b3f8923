"""Throwaway Redis, PostgreSQL and S3 servers on free loopback ports, for fault tests and benchmarks.

Each keeps its state in a temporary place and can be stopped and started again (a restart), so
a test can take a server away from the service without touching the shared ones.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

from launcher.stack import free_port

PG_BIN = Path(os.environ.get("QUANT_PG_BIN", "/usr/lib/postgresql/15/bin"))


@dataclass
class RedisServer:
    """`redis-server` with no RDB snapshot and no AOF: a restart forgets every queue, as a Redis
    configured as a cache (or one that lost its disk) does."""

    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @staticmethod
    def available() -> bool:
        return shutil.which("redis-server") is not None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, start_new_session=True)
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise TimeoutError(f"redis-server did not answer on port {self.port} within {timeout} s")

    def kill(self) -> None:
        """SIGKILL: nothing is saved (nothing would be anyway)."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None


@dataclass
class PostgresCluster:
    """A cluster made by `initdb` in a temporary directory, trust authentication, user `postgres`.

    PostgreSQL refuses to run as root: as root, every command runs as the `postgres` system user
    through `runuser` (`unavailable_reason` says when that is impossible).
    """

    port: int = field(default_factory=free_port)
    data: Path | None = None

    @staticmethod
    def unavailable_reason() -> str | None:
        if not (PG_BIN / "initdb").exists():
            return f"PostgreSQL server binaries not found in {PG_BIN} (set QUANT_PG_BIN)"
        if os.geteuid() == 0 and shutil.which("runuser") is None:
            return "running as root without runuser: PostgreSQL cannot run as root"
        return None

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, program: str, *args: str, check: bool = True) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*prefix, str(PG_BIN / program), *args], check=check, capture_output=True)

    def init(self) -> None:
        self.data = Path(tempfile.mkdtemp(prefix="quant-pg-"))
        if os.geteuid() == 0:
            shutil.chown(self.data, "postgres")
        self._run("initdb", "-D", str(self.data / "db"), "-A", "trust", "-U", "postgres")

    def start(self) -> None:
        # fsync off: a throwaway cluster need not survive a power cut, and it spares the shared disk.
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        log = str(self.data / "log")
        self._run("pg_ctl", "-D", str(self.data / "db"), "-w", "-t", "30", "-o", options, "-l", log, "start")

    def stop(self, mode: str = "fast") -> None:
        """`fast` ends every client connection at once, as a restart or failover does."""
        self._run("pg_ctl", "-D", str(self.data / "db"), "-w", "-t", "30", "-m", mode, "stop")

    def destroy(self) -> None:
        if self.data is not None:
            self._run("pg_ctl", "-D", str(self.data / "db"), "-m", "immediate", "stop", check=False)
            shutil.rmtree(self.data, ignore_errors=True)
            self.data = None


# Credentials moto's server accepts (any); set for every client and every process a service starts.
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@dataclass
class S3Server:
    """A real S3 API: moto's standalone server (``moto[server]``, a dev dependency), in memory; clients
    and buckets of its ``endpoint`` come from ``s3_client`` and ``new_bucket``."""

    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            try:
                httpx.get(f"{self.endpoint}/moto-api/", timeout=1).raise_for_status()
                return
            except httpx.HTTPError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    message = f"moto's S3 server did not answer on port {self.port} within {timeout} s"
                    raise TimeoutError(message) from None
                time.sleep(0.2)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
            self.process = None


def s3_client(endpoint: str):
    """A boto3 client of the S3 server at ``endpoint`` (boto3 is imported here: only S3's callers need it)."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=S3_CREDENTIALS["AWS_DEFAULT_REGION"],
    )


def new_bucket(endpoint: str) -> str:
    """An empty bucket of its own on the S3 server at ``endpoint``."""
    name = f"quant-{uuid.uuid4().hex[:12]}"
    s3_client(endpoint).create_bucket(Bucket=name)
    return name
