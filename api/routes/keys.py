"""`/keys`: the calling project's API keys: list, create (the key shown once), revoke.

Any live key of a project manages all of the project's keys (there are no roles). Revocation takes
effect on the next request, in every API process: keys are looked up in the database on each
request, never cached. A key may revoke itself.
"""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Response

from api.deps import ProjectDep, SessionDep
from api.problems import Problem
from api.schemas import ApiKeyCreate, ApiKeyCreated, ApiKeyPublic
from jobs import keys
from jobs.models import ApiKey

router = APIRouter(prefix="/keys", tags=["keys"])


@router.get("", response_model=list[ApiKeyPublic], summary="List the project's API keys (never the secret)")
def list_keys(session: SessionDep, project: ProjectDep) -> list[ApiKey]:
    """Newest first, revoked keys included (with `revoked_at`); `last_used_at` shows which are in use."""
    return list(keys.list_keys(session=session, project_id=project.id))


@router.post("", status_code=201, response_model=ApiKeyCreated, summary="Create an API key")
def create_key(session: SessionDep, project: ProjectDep, body: ApiKeyCreate | None = None) -> ApiKeyCreated:
    """The response carries the key; only its SHA-256 is stored, so it cannot be shown again."""
    row, plaintext = keys.create_api_key(session=session, project_id=project.id, name=(body or ApiKeyCreate()).name)
    session.commit()
    return ApiKeyCreated.model_validate({**ApiKeyPublic.model_validate(row).model_dump(), "key": plaintext})


@router.delete("/{key_id}", status_code=204, summary="Revoke an API key")
def revoke_key(session: SessionDep, project: ProjectDep, key_id: uuid.UUID) -> Response:
    """Requests with the key get 401 from now on. Revoking a revoked key changes nothing (204)."""
    key = keys.get_key(session=session, project_id=project.id, key_id=key_id)
    if key is None:
        raise Problem(404, f"API key {key_id} not found", slug="key-not-found")
    keys.revoke_key(session=session, key=key)
    session.commit()
    return Response(status_code=204)
