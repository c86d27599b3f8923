"""`quant-admin`: operator commands that talk to the database directly.

quant-admin create-key --project NAME [--name LABEL]   create the project if needed, print a new key
quant-admin list-keys --project NAME                   id, prefix, name, created, last used, revoked
quant-admin revoke-key --project NAME (--id UUID | --prefix qk_...)   the key gets 401 from now on
quant-admin set-quota --project NAME [--storage-bytes N|default] [--concurrent-jobs N|default]
quant-admin migrate                                    alembic upgrade head
"""

from __future__ import annotations

import argparse
import sys
import uuid
from datetime import datetime
from pathlib import Path

from sqlalchemy import inspect, make_url
from sqlalchemy.exc import SQLAlchemyError

from jobs import keys, queries
from jobs.config import settings
from jobs.db import get_engine, session_scope
from jobs.models import Project
from jobs.quotas import concurrent_jobs_use, storage_use


class AdminError(Exception):
    """A command that cannot be done as asked; printed without a traceback, exit status 2."""


def _database() -> str:
    """The configured database's URL once it is known to exist and to be migrated; AdminError saying
    which database and what to do otherwise. Opening a missing SQLite file would create it, empty."""
    url = settings.resolved_database_url
    shown = make_url(url).render_as_string(hide_password=True)
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        raise AdminError(
            f"no database at {shown} (QUANT_VAR_DIR={settings.var_dir}, DATABASE_URL unset): "
            "run `quant-admin migrate` to create it, or point DATABASE_URL / QUANT_VAR_DIR at the service's"
        )
    try:
        migrated = inspect(get_engine(url)).has_table("alembic_version")
    except SQLAlchemyError as exc:
        raise AdminError(f"cannot open the database at {shown}: {_first_line(exc)}") from exc
    if not migrated:
        raise AdminError(f"the database at {shown} is not migrated: run `quant-admin migrate`")
    return url


def _first_line(exc: SQLAlchemyError) -> str:
    return str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]


def _project(session, name: str) -> Project:
    project = queries.get_project_by_name(session=session, name=name)
    if project is None:
        raise AdminError(f"no project named {name!r}")
    return project


def create_key(project_name: str, label: str) -> str:
    with session_scope(_database()) as session:
        project = queries.get_project_by_name(session=session, name=project_name)
        if project is None:
            project = queries.create_project(session=session, name=project_name)
        _row, key = keys.create_api_key(session=session, project_id=project.id, name=label)
    return key


def list_keys(project_name: str) -> list[str]:
    with session_scope(_database()) as session:
        project = _project(session, project_name)
        return [
            f"{k.id}  {k.prefix}…  {k.name or '-'}  created {_when(k.created_at)}  last used {_when(k.last_used_at)}"
            + (f"  REVOKED {_when(k.revoked_at)}" if k.revoked_at else "")
            for k in keys.list_keys(session=session, project_id=project.id)
        ]


def _when(moment: datetime | None) -> str:
    return f"{moment:%Y-%m-%d %H:%M}" if moment else "never"


def revoke_key(project_name: str, *, key_id: str | None, prefix: str | None) -> str:
    with session_scope(_database()) as session:
        project = _project(session, project_name)
        if key_id is not None:
            try:
                found = keys.get_key(session=session, project_id=project.id, key_id=uuid.UUID(key_id))
            except ValueError as exc:
                raise AdminError(f"--id {key_id!r} is not a UUID") from exc
            matches = [found] if found is not None else []
        else:
            matches = list(keys.find_keys_by_prefix(session=session, project_id=project.id, prefix=prefix or ""))
        if len(matches) != 1:
            what = f"id {key_id}" if key_id else f"prefix {prefix!r}"
            raise AdminError(f"{len(matches)} keys of project {project_name!r} match {what}; need exactly one")
        key = keys.revoke_key(session=session, key=matches[0])
        return f"revoked {key.id} ({key.prefix}…)"


def set_quota(project_name: str, *, storage_bytes: str | None, concurrent_jobs: str | None) -> str:
    def parse(value: str, option: str) -> int | None:
        if value == "default":
            return None
        if not value.isdigit():
            raise AdminError(f"{option} takes a non-negative integer or 'default', not {value!r}")
        return int(value)

    with session_scope(_database()) as session:
        project = _project(session, project_name)
        if storage_bytes is not None:
            project.max_storage_bytes = parse(storage_bytes, "--storage-bytes")
        if concurrent_jobs is not None:
            project.max_concurrent_jobs = parse(concurrent_jobs, "--concurrent-jobs")
        storage = storage_use(session=session, project=project, settings=settings)
        jobs = concurrent_jobs_use(session=session, project=project, settings=settings)
        return f"project {project_name}: " + ", ".join(f"{u.quota} {u.used} used of {u.limit}" for u in (storage, jobs))


def migrate() -> None:
    from alembic import command
    from alembic.config import Config

    config = Config(str(Path(__file__).resolve().parent.parent / "alembic.ini"))
    config.set_main_option("script_location", str(Path(__file__).resolve().parent.parent / "migrations"))
    command.upgrade(config, "head")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="quant-admin", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    create = commands.add_parser("create-key", help="create an API key (and the project if it does not exist)")
    create.add_argument("--project", required=True)
    create.add_argument("--name", default="", help="a label for the key")
    listing = commands.add_parser("list-keys", help="list a project's keys (never the secret)")
    listing.add_argument("--project", required=True)
    revoke = commands.add_parser("revoke-key", help="revoke a key: requests with it get 401 at once")
    revoke.add_argument("--project", required=True)
    which = revoke.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", dest="key_id", help="the key's id (list-keys, GET /api/v1/keys)")
    which.add_argument("--prefix", help="the key's first characters, e.g. qk_AbC1234")
    quota = commands.add_parser("set-quota", help="override a project's quotas ('default' restores the settings')")
    quota.add_argument("--project", required=True)
    quota.add_argument("--storage-bytes")
    quota.add_argument("--concurrent-jobs")
    commands.add_parser("migrate", help="bring the database schema to the latest revision")
    args = parser.parse_args(argv)
    try:
        if args.command == "create-key":
            print(create_key(args.project, args.name))
        elif args.command == "list-keys":
            print("\n".join(list_keys(args.project)) or "no keys")
        elif args.command == "revoke-key":
            print(revoke_key(args.project, key_id=args.key_id, prefix=args.prefix))
        elif args.command == "set-quota":
            print(set_quota(args.project, storage_bytes=args.storage_bytes, concurrent_jobs=args.concurrent_jobs))
        elif args.command == "migrate":
            migrate()
    except AdminError as exc:
        print(f"quant-admin: {exc}", file=sys.stderr)
        return 2
    except SQLAlchemyError as exc:  # the server went away, or a schema older than this code
        print(f"quant-admin: database error: {_first_line(exc)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
