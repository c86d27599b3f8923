"""Shared fixtures: real PostgreSQL / SQLite databases, real Redis, real API and worker processes.

`service` is parametrized by database (SQLite file, fresh PostgreSQL database), so every test that
uses it runs against both. Each service gets its own storage root, its own Redis database number
and its own processes, started the way `make run` starts them (`launcher.stack`).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
from sqlalchemy import create_engine, text

from jobs import keys, queries
from jobs.db import session_scope
from launcher.servers import S3Server
from launcher.stack import Stack

PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
REDIS_LOCK = "quant-test:lock"
ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A real S3 API (moto's standalone server) on a free 127.0.0.1 port, stopped at the end."""
    server = S3Server()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_endpoint(s3_server: S3Server) -> str:
    return s3_server.endpoint


@pytest.fixture(scope="session")
def digits(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The sample CNN trained on scikit-learn's digits, exported to ONNX, and its .npz (built once)."""
    from samples.digits import build_digits

    return build_digits(tmp_path_factory.mktemp("digits"))


@contextmanager
def make_database(kind: str) -> Iterator[str]:
    """A fresh, migrated-from-nothing database URL of the given kind; dropped afterwards."""
    if kind == "sqlite":
        path = Path(os.environ.get("TMPDIR", "/tmp")) / f"quant-test-{uuid.uuid4().hex[:8]}.db"
        try:
            yield f"sqlite:///{path}"
        finally:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
        return
    name = f"quant_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        from jobs.db import get_engine

        get_engine.cache_clear()
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest) -> Iterator[str]:
    """A migrated database of each kind, for tests of the queries alone (no service)."""
    from alembic import command
    from alembic.config import Config

    from jobs.db import get_engine

    with make_database(request.param) as url:
        config = Config(str(ROOT / "alembic.ini"))
        config.attributes["url"] = url
        command.upgrade(config, "head")
        yield url
        get_engine(url).dispose()


@contextmanager
def redis_database() -> Iterator[str]:
    """A Redis database number no other test run on this machine holds, emptied for this run.

    Test runs may overlap (a developer's and CI's); each claims a free database with a lock key
    that expires by itself if the run is killed, and skips any database that still has clients.
    """
    in_use = {int(entry["db"]) for entry in redis.Redis.from_url("redis://127.0.0.1:6379/0").client_list()}
    for number in range(1, 16):
        if number in in_use:
            # Connected clients with no lock are a dead run's workers and API: they would take this
            # run's tasks off its queues.
            continue
        url = f"redis://127.0.0.1:6379/{number}"
        client = redis.Redis.from_url(url)
        if client.set(REDIS_LOCK, os.getpid(), nx=True, ex=3600):
            for key in client.scan_iter():
                if key != REDIS_LOCK.encode():
                    client.delete(key)
            try:
                yield url
            finally:
                client.delete(REDIS_LOCK)
            return
    raise RuntimeError("every Redis database 1-15 is held by another test run or has clients")


@dataclass
class Service:
    kind: str
    url: str
    database_url: str
    var_dir: Path
    stack: Stack

    def new_key(self, project: str | None = None) -> str:
        with session_scope(self.database_url) as session:
            name = project or f"project-{uuid.uuid4().hex[:8]}"
            row = queries.get_project_by_name(session=session, name=name) or queries.create_project(
                session=session, name=name
            )
            _key, plaintext = keys.create_api_key(session=session, project_id=row.id)
        return plaintext

    def client(self, key: str | None = None, **kwargs) -> httpx.Client:
        headers = {"X-API-Key": key if key is not None else self.new_key()}
        return httpx.Client(base_url=f"{self.url}/api/v1", headers=headers, timeout=120, **kwargs)

    def upload(self, key: str, model: bytes, dataset: bytes) -> tuple[dict, dict]:
        """Upload a model and a dataset into the key's project; both must be accepted."""
        with self.client(key) as client:
            model_response = client.post("/models", files={"file": ("model.onnx", model)})
            assert model_response.status_code == 201, model_response.text
            dataset_response = client.post("/datasets", files={"file": ("data.npz", dataset)})
            assert dataset_response.status_code == 201, dataset_response.text
        return model_response.json(), dataset_response.json()

    def start_job_worker(self, name: str = "gpu") -> None:
        self.stack.start_worker(name, "gpu", concurrency=1)

    def start_default_worker(self) -> None:
        """The `default` queue worker with beat (reaper, webhook poller), as the fixture starts it."""
        self.stack.start_worker("default", "default", beat=True)


SERVICE_ENV = {
    "QUANT_ENVIRONMENT": "test",
    "QUANT_MAX_MODEL_BYTES": str(4 * 1024 * 1024),
    "QUANT_MAX_DATASET_BYTES": str(32 * 1024 * 1024),
    "QUANT_MAX_DATASET_IMAGES": "500",  # so the too-many-files test needs 501 members, not 100,001
    # Short beats so the crash tests finish in seconds; the timeout stays several beats long.
    "QUANT_HEARTBEAT_INTERVAL": "0.5",
    "QUANT_HEARTBEAT_TIMEOUT": "4",
    "QUANT_REAPER_INTERVAL": "1",
    # Engine routing: workers re-register every half second; a job waits 8 s for a GPU worker.
    "QUANT_WORKER_HEARTBEAT_INTERVAL": "0.5",
    "QUANT_WORKER_HEARTBEAT_TIMEOUT": "4",
    "QUANT_ENGINE_WAIT_SECONDS": "8",
    # Webhooks: retries after 1, 3, 6 s instead of minutes to hours; the poller every half second;
    # a 2 s attempt timeout (so a dead worker's lease, 4 x timeout + 15 s, ends within the test);
    # the tests' receiver on 127.0.0.1 allowed (every other loopback/private address stays refused).
    "QUANT_WEBHOOK_RETRY_SCHEDULE": "[0, 1, 3, 6]",
    "QUANT_WEBHOOK_POLL_INTERVAL": "0.5",
    "QUANT_WEBHOOK_TIMEOUT": "2",
    "QUANT_WEBHOOK_ALLOWED_NETWORKS": '["127.0.0.1/32"]',
}


@contextmanager
def started_service(kind: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """The API, the `default` worker (with beat) and the `gpu` worker on a fresh ``kind`` database."""
    var_dir = tmp_path_factory.mktemp(f"var-{kind}")
    with make_database(kind) as database_url, redis_database() as broker_url:
        env = dict(
            os.environ, DATABASE_URL=database_url, BROKER_URL=broker_url, QUANT_VAR_DIR=str(var_dir), **SERVICE_ENV
        )
        log_dir = ARTIFACTS / "logs" / f"{kind}-{os.getpid()}"  # overlapping runs keep their own logs
        stack = Stack(env=env, log_dir=log_dir)
        try:
            stack.migrate()
            stack.start_worker("default", "default", beat=True)
            stack.start_worker("gpu", "gpu")
            url = stack.start_api()
            yield Service(kind=kind, url=url, database_url=database_url, var_dir=var_dir, stack=stack)
        finally:
            stack.stop()


@pytest.fixture(scope="session")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Service]]:
    """kind -> its service, started on first use and kept to the end of the session.

    ``service`` is parametrized, and pytest ends a parametrized fixture whenever the next test wants the
    other parameter: with the tests sent file by file to the pytest workers, each file would otherwise
    start both services again (some 20 s each).
    """
    with ExitStack() as stack:
        started: dict[str, Service] = {}

        def get(kind: str) -> Service:
            if kind not in started:
                started[kind] = stack.enter_context(started_service(kind, tmp_path_factory))
            return started[kind]

        yield get


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def service(request: pytest.FixtureRequest, services: Callable[[str], Service]) -> Service:
    return services(request.param)
