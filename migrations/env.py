"""Alembic environment: the URL from jobs.config, the target metadata from jobs.models."""

from __future__ import annotations

from alembic import context

from jobs.config import settings
from jobs.db import get_engine
from jobs.models import Base

config = context.config
target_metadata = Base.metadata


def database_url() -> str:
    # Tests and tools may pass a URL explicitly (`config.attributes["url"]`).
    return config.attributes.get("url") or settings.resolved_database_url


def run_migrations_offline() -> None:
    context.configure(url=database_url(), target_metadata=target_metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    url = database_url()
    with get_engine(url).connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=url.startswith("sqlite"),
            compare_type=True,
        )
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
