"""The Alembic revisions build exactly the schema jobs.models declares, on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext

from jobs.db import get_engine
from jobs.models import Base
from tests.conftest import make_database

ROOT = Path(__file__).resolve().parent.parent


def _config(url: str) -> Config:
    config = Config(str(ROOT / "alembic.ini"))
    config.attributes["url"] = url
    return config


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_migrations_match_models(kind: str) -> None:
    with make_database(kind) as url:
        config = _config(url)
        command.upgrade(config, "head")
        with get_engine(url).connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            diff = compare_metadata(context, Base.metadata)
        assert diff == [], f"models and migrations disagree: {diff}"
        # And the way down works too, leaving only Alembic's own table.
        command.downgrade(config, "base")
        with get_engine(url).connect() as connection:
            context = MigrationContext.configure(connection)
            leftover = [d for d in compare_metadata(context, Base.metadata) if d[0] not in ("add_table", "add_index")]
        assert leftover == []
        get_engine(url).dispose()
