"""Settings refuse unsafe combinations instead of starting with them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from jobs.config import Settings
from jobs.queue import make_celery


def test_production_refuses_embedded_database_and_broker() -> None:
    with pytest.raises(ValidationError, match="PostgreSQL"):
        Settings(environment="production", database_url="sqlite:///x.db", broker_url="redis://r:6379/0")
    with pytest.raises(ValidationError, match="Redis"):
        Settings(environment="production", database_url="postgresql+psycopg://h/db", broker_url="filesystem://")
    ok = Settings(environment="production", database_url="postgresql+psycopg://h/db", broker_url="redis://r/0")
    assert ok.visibility_timeout > ok.job_time_limit


def test_heartbeat_timeout_must_cover_several_beats() -> None:
    with pytest.raises(ValidationError, match="heartbeat_timeout"):
        Settings(heartbeat_interval=10, heartbeat_timeout=15)


def test_embedded_default_is_sqlite_under_var(tmp_path) -> None:
    settings = Settings(var_dir=tmp_path, database_url=None)
    assert settings.resolved_database_url == f"sqlite:///{tmp_path.resolve() / 'quant.db'}"


def test_the_embedded_broker_keeps_every_file_under_its_folder(tmp_path, monkeypatch) -> None:
    # Remote control (a worker ping, a shutdown broadcast) writes kombu's exchange tables; left to its
    # default, the filesystem transport puts them in ./control of whatever directory the process started in.
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    settings = Settings(var_dir=tmp_path / "var", database_url=None, broker_url="filesystem://")
    app = make_celery(settings, "filesystem://")
    with app.connection_for_write() as connection:  # what a starting worker does: bind its control queue
        node = app.control.mailbox(connection).Node("probe@host", channel=connection.channel())
        node.listen().cancel()
    assert list(elsewhere.iterdir()) == []
    assert list((settings.broker_dir / "control").iterdir()), "the broadcast left no exchange table"
