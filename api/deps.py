"""Request dependencies as `Annotated` aliases: settings, DB session, the caller's project, Celery.

The ones that do no I/O are `async def`: FastAPI runs a plain `def` dependency in its thread pool,
a hop that costs more CPU than reading an attribute (about 60 us per hop here).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from celery import Celery
from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader
from sqlalchemy.orm import Session

from api.problems import Problem
from jobs import queries
from jobs.config import Settings
from jobs.db import session_scope
from jobs.models import Project


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_session(settings: SettingsDep) -> Iterator[Session]:
    with session_scope(settings.resolved_database_url) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]

_api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="A project's API key.")


def get_project(session: SessionDep, api_key: Annotated[str | None, Security(_api_key_header)]) -> Project:
    if not api_key:
        raise Problem(401, "missing X-API-Key header", slug="missing-api-key", headers={"WWW-Authenticate": "ApiKey"})
    project = queries.project_for_key(session=session, key=api_key)
    if project is None:
        raise Problem(401, "unknown or revoked API key", slug="invalid-api-key", headers={"WWW-Authenticate": "ApiKey"})
    if session.dirty:  # last_used_at moved (once a minute per key): persist it even if the request later fails
        session.commit()
    return project


ProjectDep = Annotated[Project, Depends(get_project)]


async def get_celery(request: Request) -> Celery:
    return request.app.state.celery


CeleryDep = Annotated[Celery, Depends(get_celery)]
