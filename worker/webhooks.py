"""Webhook delivery: the periodic poll that leases due deliveries, and one signed HTTP attempt each.

    beat ─▶ poll(): claim_due (lease + token) ─▶ one DELIVER_WEBHOOK task per delivery
    deliver(): prepare_attempt ─▶ SSRF check (fresh DNS) ─▶ POST to the checked address
             ─▶ record_attempt (success, 410, or the next next_attempt_at)

No redirects are followed (a 3xx is a failed attempt), the attempt times out after
`webhook_timeout` seconds, and only the first bytes of the answer are read and kept.
"""

from __future__ import annotations

import email.utils
import ipaddress
import logging
import time
import uuid
from urllib.parse import urlsplit, urlunsplit

import httpx
from celery import Celery

from jobs import webhooks
from jobs.config import Settings, settings
from jobs.db import session_scope
from jobs.models import utcnow
from jobs.queue import enqueue_delivery
from jobs.signing import signed_headers
from jobs.ssrf import UnsafeTarget, check_url

log = logging.getLogger(__name__)
USER_AGENT = "quantservice-webhooks/0.1"
READ_BYTES = webhooks.RESPONSE_EXCERPT_CHARS


def poll(app: Celery) -> int:
    """Lease every due delivery and hand each to its own task; returns how many."""
    # An attempt in flight must not outlive its lease: connecting, sending and waiting for the answer
    # may each take up to the timeout, and reading the answer stops at the timeout too.
    lease = 4 * settings.webhook_timeout + 15
    with session_scope(settings.resolved_database_url) as session:
        claimed = webhooks.claim_due(
            session=session, now=utcnow(), limit=settings.webhook_poll_batch, lease_seconds=lease
        )
    for delivery_id, claim in claimed:
        enqueue_delivery(app, delivery_id, claim)
    return len(claimed)


def deliver(delivery_id: uuid.UUID, claim: uuid.UUID) -> None:
    """One attempt of one delivery; a stale claim (the lease was taken over) does nothing."""
    url = settings.resolved_database_url
    with session_scope(url) as session:
        outgoing = webhooks.prepare_attempt(session=session, delivery_id=delivery_id, claim=claim)
    if outgoing is None:
        return
    result = send(outgoing, settings)
    log.info(
        "webhook %s to %s: %s", outgoing.webhook_id, outgoing.url, result.status_code or result.error or "no answer"
    )
    with session_scope(url) as session:
        recorded = webhooks.record_attempt(
            session=session, delivery_id=delivery_id, claim=claim, result=result, settings=settings
        )
    if recorded is None:
        log.warning("delivery %s was taken over while its attempt ran; result dropped", delivery_id)


def send(outgoing: webhooks.Outgoing, config: Settings) -> webhooks.AttemptResult:
    """POST the signed body to the URL's checked address; never raises for network trouble."""
    try:
        addresses = check_url(outgoing.url, allowed=config.allowed_webhook_networks)
    except UnsafeTarget as exc:
        return webhooks.AttemptResult(status_code=None, latency_ms=None, error=f"refused: {exc}")
    parts = urlsplit(outgoing.url)
    address = addresses[0]
    literal = f"[{address}]" if isinstance(address, ipaddress.IPv6Address) else str(address)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    # Connect to the address just checked (a second DNS lookup could answer differently), while
    # Host and TLS SNI/certificate checks still use the name from the URL.
    pinned = urlunsplit((parts.scheme, f"{literal}:{port}", parts.path or "/", parts.query, ""))
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
    host_header = host if parts.port is None else f"{host}:{parts.port}"
    headers = signed_headers(
        secrets=outgoing.secrets, webhook_id=outgoing.webhook_id, timestamp=int(time.time()), body=outgoing.body
    )
    headers.update({"host": host_header, "user-agent": USER_AGENT})
    extensions = {"sni_hostname": parts.hostname} if parts.scheme == "https" else {}
    started = time.perf_counter()
    try:
        with (
            httpx.Client(timeout=config.webhook_timeout, follow_redirects=False, trust_env=False) as client,
            client.stream("POST", pinned, content=outgoing.body, headers=headers, extensions=extensions) as response,
        ):
            excerpt = _read_some(response, deadline=started + config.webhook_timeout)
            latency = (time.perf_counter() - started) * 1000
            retry_after = None
            if response.status_code == 429 or response.status_code >= 500:
                retry_after = parse_retry_after(response.headers.get("retry-after"))
            error = None
            if response.is_redirect:
                error = f"HTTP {response.status_code} redirect to {response.headers.get('location')!r} (not followed)"
            return webhooks.AttemptResult(
                status_code=response.status_code,
                latency_ms=latency,
                response=excerpt,
                error=error,
                retry_after=retry_after,
            )
    except httpx.TimeoutException:
        error = f"timed out after {config.webhook_timeout:g} s"
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
    return webhooks.AttemptResult(status_code=None, latency_ms=(time.perf_counter() - started) * 1000, error=error)


def _read_some(response: httpx.Response, deadline: float) -> str:
    """The first READ_BYTES of the body; stops early at `deadline` (a receiver that drips bytes)."""
    chunks, size = [], 0
    for chunk in response.iter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size >= READ_BYTES or time.perf_counter() > deadline:
            break
    return b"".join(chunks)[:READ_BYTES].decode("utf-8", errors="replace")


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After as seconds: delta-seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (moment - utcnow()).total_seconds())
