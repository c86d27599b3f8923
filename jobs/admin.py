"""`quant-admin`: operator commands that talk to the database directly.

quant-admin create-key --project NAME [--name LABEL]   create the project if needed, print a new key
quant-admin migrate                                    alembic upgrade head
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jobs import queries
from jobs.config import settings
from jobs.db import session_scope


def create_key(project_name: str, label: str) -> str:
    with session_scope(settings.resolved_database_url) as session:
        project = queries.get_project_by_name(session=session, name=project_name)
        if project is None:
            project = queries.create_project(session=session, name=project_name)
        _row, key = queries.create_api_key(session=session, project=project, name=label)
    return key


def migrate() -> None:
    from alembic import command
    from alembic.config import Config

    config = Config(str(Path(__file__).resolve().parent.parent / "alembic.ini"))
    config.set_main_option("script_location", str(Path(__file__).resolve().parent.parent / "migrations"))
    command.upgrade(config, "head")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="quant-admin", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    key = commands.add_parser("create-key", help="create an API key (and the project if it does not exist)")
    key.add_argument("--project", required=True)
    key.add_argument("--name", default="", help="a label for the key")
    commands.add_parser("migrate", help="bring the database schema to the latest revision")
    args = parser.parse_args(argv)
    if args.command == "create-key":
        print(create_key(args.project, args.name))
    elif args.command == "migrate":
        migrate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
