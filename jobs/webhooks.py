"""Webhook endpoints, deliveries and attempts: every read and write, keyword-only, for API and worker.

Delivery cycle (driven by `next_attempt_at`, polled by a periodic task; never long Celery countdowns):

    pending, next_attempt_at ≤ now ─ claim_due ─▶ leased (next_attempt_at = now + lease, claim = token)
      ─ prepare_attempt ─▶ HTTP POST (worker) ─ record_attempt ─▶ succeeded            (2xx)
                                                               ├▶ failed, endpoint off  (410 Gone)
                                                               ├▶ failed                (schedule exhausted)
                                                               └▶ pending, next_attempt_at = now + backoff

A worker that dies mid-attempt leaves the lease to expire; the next poll claims the delivery again
under a new token, and the dead attempt's late task (if redelivered) finds its token stale.
"""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from jobs.config import Settings
from jobs.cursors import paginate
from jobs.models import DeliveryStatus, Job, WebhookAttempt, WebhookDelivery, WebhookEndpoint, WebhookMessage, utcnow
from jobs.outbox import PING_EVENT_TYPE, add_delivery, add_message, webhook_id
from jobs.signing import generate_secret

RESPONSE_EXCERPT_CHARS = 1024


# Endpoints ------------------------------------------------------------------------------------


def create_endpoint(
    *, session: Session, project_id: uuid.UUID, url: str, event_types: list[str], description: str = ""
) -> WebhookEndpoint:
    """A new enabled endpoint with a fresh secret (the caller shows `endpoint.secret` once). Flushes."""
    endpoint = WebhookEndpoint(
        project_id=project_id,
        url=url,
        event_types=list(event_types),
        description=description,
        enabled=True,
        secret=generate_secret(),
    )
    session.add(endpoint)
    session.flush()
    return endpoint


def get_endpoint(*, session: Session, project_id: uuid.UUID, endpoint_id: uuid.UUID) -> WebhookEndpoint | None:
    return session.scalar(
        select(WebhookEndpoint).where(WebhookEndpoint.id == endpoint_id, WebhookEndpoint.project_id == project_id)
    )


def list_endpoints(
    *, session: Session, project_id: uuid.UUID, limit: int, cursor: str | None
) -> tuple[list[WebhookEndpoint], str | None]:
    query = select(WebhookEndpoint).where(WebhookEndpoint.project_id == project_id)
    return paginate(session=session, query=query, entity=WebhookEndpoint, limit=limit, cursor=cursor)


def update_endpoint(*, session: Session, endpoint: WebhookEndpoint, changes: dict[str, Any]) -> WebhookEndpoint:
    """Apply url / event_types / description / enabled. Re-enabling forgets the failure history."""
    for name in ("url", "description"):
        if name in changes:
            setattr(endpoint, name, changes[name])
    if "event_types" in changes:
        endpoint.event_types = list(changes["event_types"])
    if "enabled" in changes and changes["enabled"] != endpoint.enabled:
        endpoint.enabled = changes["enabled"]
        endpoint.disabled_reason = None if endpoint.enabled else "disabled through the API"
        endpoint.failing_since = None
    session.flush()
    return endpoint


def delete_endpoint(*, session: Session, endpoint: WebhookEndpoint) -> None:
    """The endpoint and its deliveries and attempts go; messages stay for other targets."""
    session.delete(endpoint)
    session.flush()


def rotate_secret(*, session: Session, endpoint: WebhookEndpoint, overlap_seconds: float) -> WebhookEndpoint:
    """A new secret signs from now on; the old one keeps signing too for `overlap_seconds`. Flushes."""
    endpoint.previous_secret = endpoint.secret if overlap_seconds > 0 else None
    endpoint.previous_secret_expires_at = utcnow() + timedelta(seconds=overlap_seconds) if overlap_seconds > 0 else None
    endpoint.secret = generate_secret()
    session.flush()
    return endpoint


def signing_secrets(endpoint: WebhookEndpoint, now: datetime) -> list[str]:
    """The current secret, then the previous one while its overlap lasts."""
    secrets = [endpoint.secret]
    expires = endpoint.previous_secret_expires_at
    if endpoint.previous_secret and expires is not None and _aware(expires) > now:
        secrets.append(endpoint.previous_secret)
    return secrets


def _aware(moment: datetime) -> datetime:
    # SQLite hands back naive datetimes for timezone-aware columns; every stored time is UTC.
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


# Messages and deliveries ----------------------------------------------------------------------


def send_ping(*, session: Session, endpoint: WebhookEndpoint) -> WebhookDelivery:
    """A `webhook.ping` message to this endpoint alone, due now. Flushes."""
    message = add_message(
        session=session,
        project_id=endpoint.project_id,
        job_id=None,
        event_type=PING_EVENT_TYPE,
        data={"endpoint_id": str(endpoint.id), "message": "a test event sent on request"},
    )
    delivery = add_delivery(session=session, message=message, endpoint_id=endpoint.id, url=endpoint.url)
    session.flush()
    return delivery


def replay(*, session: Session, delivery: WebhookDelivery, url: str) -> WebhookDelivery:
    """Send the same message again (same `webhook-id`, fresh timestamp) as a new delivery, due now."""
    copy = add_delivery(session=session, message=delivery.message, endpoint_id=delivery.endpoint_id, url=url)
    session.flush()
    return copy


def get_delivery(
    *, session: Session, project_id: uuid.UUID, delivery_id: uuid.UUID, endpoint_id: uuid.UUID | None = None
) -> WebhookDelivery | None:
    query = (
        select(WebhookDelivery)
        .join(WebhookMessage, WebhookMessage.id == WebhookDelivery.message_id)
        .where(WebhookDelivery.id == delivery_id, WebhookMessage.project_id == project_id)
    )
    if endpoint_id is not None:
        query = query.where(WebhookDelivery.endpoint_id == endpoint_id)
    return session.scalar(query)


def list_deliveries(
    *,
    session: Session,
    project_id: uuid.UUID,
    endpoint_id: uuid.UUID | None = None,
    job_id: uuid.UUID | None = None,
    limit: int,
    cursor: str | None,
) -> tuple[list[WebhookDelivery], str | None]:
    """Newest first, each with its attempts (`attempt_log`)."""
    query = (
        select(WebhookDelivery)
        .join(WebhookMessage, WebhookMessage.id == WebhookDelivery.message_id)
        .where(WebhookMessage.project_id == project_id)
    )
    if endpoint_id is not None:
        query = query.where(WebhookDelivery.endpoint_id == endpoint_id)
    if job_id is not None:
        query = query.where(WebhookMessage.job_id == job_id)
    return paginate(session=session, query=query, entity=WebhookDelivery, limit=limit, cursor=cursor)


def claim_due(
    *, session: Session, now: datetime, limit: int, lease_seconds: float
) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """Lease up to `limit` due deliveries to the caller: [(delivery id, claim token)]. Commits.

    Each lease is a compare-and-set on (status, next_attempt_at), so two pollers never both win.
    """
    due = session.scalars(
        select(WebhookDelivery.id)
        .where(WebhookDelivery.status == DeliveryStatus.pending, WebhookDelivery.next_attempt_at <= now)
        .order_by(WebhookDelivery.next_attempt_at)
        .limit(limit)
    ).all()
    claimed = []
    until = now + timedelta(seconds=lease_seconds)
    for delivery_id in due:
        token = uuid.uuid4()
        result = session.execute(
            update(WebhookDelivery)
            .where(
                WebhookDelivery.id == delivery_id,
                WebhookDelivery.status == DeliveryStatus.pending,
                WebhookDelivery.next_attempt_at <= now,
            )
            .values(next_attempt_at=until, claim=token, updated_at=now)
            .execution_options(synchronize_session=False)
        )
        if result.rowcount == 1:
            claimed.append((delivery_id, token))
    session.commit()
    return claimed


@dataclass(frozen=True)
class Outgoing:
    """Everything one attempt sends; built in a short transaction so no DB lock spans the HTTP call."""

    delivery_id: uuid.UUID
    url: str
    webhook_id: str
    body: bytes
    secrets: list[str]


def prepare_attempt(*, session: Session, delivery_id: uuid.UUID, claim: uuid.UUID) -> Outgoing | None:
    """What to send for a claimed delivery, or None when the claim is stale or the target is off.

    A delivery whose endpoint was disabled (by a user, by a 410, by failing too long) fails here
    with that reason and sends nothing. Commits.
    """
    delivery = session.get(WebhookDelivery, delivery_id, populate_existing=True)
    if delivery is None or delivery.claim != claim or delivery.status != DeliveryStatus.pending:
        return None
    now = utcnow()
    if delivery.endpoint_id is not None:
        endpoint = session.get(WebhookEndpoint, delivery.endpoint_id)
        if endpoint is None or not endpoint.enabled:
            reason = (endpoint and endpoint.disabled_reason) or "endpoint disabled"
            _close(delivery, DeliveryStatus.failed, f"not sent: {reason}")
            session.commit()
            return None
        secrets = signing_secrets(endpoint, now)
        delivery.url = endpoint.url  # retries follow a URL changed since the message was written
    else:  # a job's one-off webhook_url, signed with the job's own secret
        job = session.get(Job, delivery.message.job_id) if delivery.message.job_id else None
        if job is None or not job.webhook_secret:
            _close(delivery, DeliveryStatus.failed, "not sent: the job and its secret are gone")
            session.commit()
            return None
        secrets = [job.webhook_secret]
    message = delivery.message
    body = json.dumps(message.payload, separators=(",", ":")).encode()
    outgoing = Outgoing(
        delivery_id=delivery.id, url=delivery.url, webhook_id=webhook_id(message.id), body=body, secrets=secrets
    )
    session.commit()
    return outgoing


@dataclass(frozen=True)
class AttemptResult:
    status_code: int | None
    latency_ms: float | None
    response: str | None = None
    error: str | None = None
    # Seconds the receiver asked us to wait (429/5xx with Retry-After).
    retry_after: float | None = None

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def next_delay(
    *, attempts: int, settings: Settings, retry_after: float | None = None, rng: random.Random | None = None
) -> float | None:
    """Seconds until the next attempt after `attempts` failed ones; None when the schedule is spent.

    delay = schedule[attempts] · U(1 - jitter, 1 + jitter), and at least the receiver's Retry-After
    (capped at `webhook_retry_after_max`).
    """
    schedule = settings.webhook_retry_schedule
    if attempts >= len(schedule):
        return None
    jitter = settings.webhook_jitter
    delay = schedule[attempts] * (rng or random).uniform(1 - jitter, 1 + jitter)
    if retry_after is not None:
        delay = max(delay, min(retry_after, settings.webhook_retry_after_max))
    return delay


def record_attempt(
    *, session: Session, delivery_id: uuid.UUID, claim: uuid.UUID, result: AttemptResult, settings: Settings
) -> WebhookDelivery | None:
    """Log the attempt and decide what comes next (see the module docstring). Commits.

    None when the claim went stale meanwhile (another poll took the delivery over).
    """
    delivery = session.get(WebhookDelivery, delivery_id, populate_existing=True)
    if delivery is None or delivery.claim != claim or delivery.status != DeliveryStatus.pending:
        session.rollback()
        return None
    now = utcnow()
    response = result.response[:RESPONSE_EXCERPT_CHARS] if result.response else result.response
    session.add(
        WebhookAttempt(
            delivery_id=delivery.id,
            attempted_at=now,
            status_code=result.status_code,
            latency_ms=result.latency_ms,
            response=response,
            error=result.error,
        )
    )
    delivery.attempts += 1
    endpoint = session.get(WebhookEndpoint, delivery.endpoint_id) if delivery.endpoint_id else None
    if result.ok:
        _close(delivery, DeliveryStatus.succeeded, None)
        if endpoint is not None:
            endpoint.failing_since = None
    elif result.status_code == 410:
        _close(delivery, DeliveryStatus.failed, "the receiver answered 410 Gone")
        if endpoint is not None:
            _disable(endpoint, f"the receiver answered 410 Gone on {now.isoformat(timespec='seconds')}")
    else:
        error = result.error or f"HTTP {result.status_code}"
        delay = next_delay(attempts=delivery.attempts, settings=settings, retry_after=result.retry_after)
        if delay is None:
            _close(delivery, DeliveryStatus.failed, f"gave up after {delivery.attempts} attempts; last: {error}")
        else:
            delivery.next_attempt_at = now + timedelta(seconds=delay)
            delivery.claim = None
            delivery.last_error = error
        if endpoint is not None:
            endpoint.failing_since = endpoint.failing_since or now
            failing_for = (now - _aware(endpoint.failing_since)).total_seconds()
            if failing_for >= settings.webhook_disable_after:
                _disable(
                    endpoint,
                    f"every delivery failed for {failing_for / 3600:.1f} h "
                    f"(since {_aware(endpoint.failing_since).isoformat(timespec='seconds')}); last: {error}",
                )
    session.commit()
    return delivery


def _close(delivery: WebhookDelivery, status: DeliveryStatus, error: str | None) -> None:
    delivery.status = status
    delivery.next_attempt_at = None
    delivery.claim = None
    delivery.last_error = error


def _disable(endpoint: WebhookEndpoint, reason: str) -> None:
    endpoint.enabled = False
    endpoint.disabled_reason = reason
