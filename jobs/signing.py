"""Standard Webhooks v1 signatures: `whsec_` secrets and the `webhook-*` headers.

    signature = base64(HMAC-SHA256(key, f"{webhook_id}.{timestamp}.{body}"))
    webhook-signature: "v1,<signature>" for each active secret, space-separated

`key` is the base64-decoded part of the secret after `whsec_`; `timestamp` is integer Unix seconds,
fresh on every attempt; `webhook_id` is the message's, the same on every attempt and replay.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32  # the specification asks for 24 to 64


def generate_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def _key(secret: str) -> bytes:
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError("a webhook secret starts with 'whsec_'")
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


def sign(*, secret: str, webhook_id: str, timestamp: int, body: bytes) -> str:
    """One `v1,<base64>` signature."""
    content = f"{webhook_id}.{timestamp}.".encode() + body
    digest = hmac.new(_key(secret), content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signed_headers(*, secrets: list[str], webhook_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers; every secret in `secrets` contributes a signature."""
    signatures = " ".join(sign(secret=s, webhook_id=webhook_id, timestamp=timestamp, body=body) for s in secrets)
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signatures,
        "content-type": "application/json",
    }
