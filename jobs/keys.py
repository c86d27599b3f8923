"""API keys: random, shown once, stored only as a SHA-256 hash.

A key looks like `qk_<43 url-safe base64 chars>` (32 random bytes). A fast hash is the right
choice here (unlike passwords) because the key has 256 bits of entropy: nothing to brute-force.
"""

from __future__ import annotations

import hashlib
import secrets

PREFIX = "qk_"


def generate_key() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def display_prefix(key: str) -> str:
    return key[:10]
