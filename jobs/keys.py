"""API keys: random, shown once, stored only as a SHA-256 hash, revocable.

A key looks like `qk_<43 url-safe base64 chars>` (32 random bytes). A fast hash is the right
choice here (unlike passwords) because the key has 256 bits of entropy: nothing to brute-force.
Revocation stamps `revoked_at`; `jobs.queries.project_for_key` reads the row on every request
(no cache), so a revoked key gets 401 from the next request on, in every API process.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.models import ApiKey, utcnow

PREFIX = "qk_"


def generate_key() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def display_prefix(key: str) -> str:
    return key[:10]


def list_keys(*, session: Session, project_id: uuid.UUID) -> Sequence[ApiKey]:
    """The project's keys, revoked ones included, newest first."""
    return session.scalars(
        select(ApiKey).where(ApiKey.project_id == project_id).order_by(ApiKey.created_at.desc(), ApiKey.id.desc())
    ).all()


def get_key(*, session: Session, project_id: uuid.UUID, key_id: uuid.UUID) -> ApiKey | None:
    return session.scalar(select(ApiKey).where(ApiKey.id == key_id, ApiKey.project_id == project_id))


def find_keys_by_prefix(*, session: Session, project_id: uuid.UUID, prefix: str) -> Sequence[ApiKey]:
    """Keys whose display prefix starts with `prefix` (what `quant-admin list-keys` shows)."""
    return session.scalars(
        select(ApiKey).where(ApiKey.project_id == project_id, ApiKey.prefix.startswith(prefix, autoescape=True))
    ).all()


def revoke_key(*, session: Session, key: ApiKey) -> ApiKey:
    """Stamp `revoked_at` (idempotent: a revoked key keeps its first revocation time)."""
    if key.revoked_at is None:
        key.revoked_at = utcnow()
        session.flush()
    return key
