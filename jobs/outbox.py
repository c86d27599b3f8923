"""The webhook outbox: what is written, in the caller's transaction, when something worth announcing happens.

A job's terminal transition (`jobs.queries`) calls `record_job_end` before it commits, so the
message and its deliveries exist if and only if the job ended: a crash can neither lose the
notification nor announce a job that did not end. The worker's poller sends them later.

    WebhookMessage (one per event; its id is the `webhook-id`)
      └─ WebhookDelivery per target: each enabled endpoint subscribed to the event type,
         plus the job's one-off `webhook_url`; `next_attempt_at` = now (the first attempt is immediate)
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.config import settings
from jobs.models import (
    DeliveryStatus,
    Job,
    JobStatus,
    Model,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookMessage,
    utcnow,
)

API_PREFIX = "/api/v1"
JOB_EVENT_TYPES = {
    JobStatus.succeeded: "job.succeeded",
    JobStatus.failed: "job.failed",
    JobStatus.canceled: "job.canceled",
}
EVENT_TYPES = tuple(JOB_EVENT_TYPES.values())
PING_EVENT_TYPE = "webhook.ping"


def webhook_id(message_id: uuid.UUID) -> str:
    return f"msg_{message_id.hex}"


def job_links(job_id: uuid.UUID, status: JobStatus) -> dict[str, str | None]:
    base = f"{settings.public_url.rstrip('/')}{API_PREFIX}/jobs/{job_id}"
    succeeded = status == JobStatus.succeeded
    return {
        "job": base,
        "events": f"{base}/events",
        "report": f"{base}/report" if succeeded else None,
        "artifacts": f"{base}/artifacts" if succeeded else None,
    }


def record_job_end(*, session: Session, job_id: uuid.UUID, status: JobStatus) -> WebhookMessage | None:
    """Write the `job.<status>` message and one delivery per target; None when nobody listens. Flushes."""
    event_type = JOB_EVENT_TYPES[status]
    # Columns, not the ORM object: the caller's UPDATE did not refresh any Job already in the session.
    row = session.execute(
        select(
            Job.project_id, Job.model_id, Job.dataset_id, Job.error, Job.finished_at, Job.webhook_url, Model.filename
        )
        .join(Model, Model.id == Job.model_id)
        .where(Job.id == job_id)
    ).one()
    endpoints = session.scalars(
        select(WebhookEndpoint).where(WebhookEndpoint.project_id == row.project_id, WebhookEndpoint.enabled.is_(True))
    ).all()
    targets: list[tuple[uuid.UUID | None, str]] = [(e.id, e.url) for e in endpoints if event_type in e.event_types]
    if row.webhook_url:
        targets.append((None, row.webhook_url))
    if not targets:
        return None
    data = {
        "job_id": str(job_id),
        "status": status.value,
        "error": row.error,
        "model": {"id": str(row.model_id), "filename": row.filename},
        "dataset_id": str(row.dataset_id),
        "finished_at": row.finished_at.isoformat() if row.finished_at else None,
        "links": job_links(job_id, status),
    }
    message = add_message(session=session, project_id=row.project_id, job_id=job_id, event_type=event_type, data=data)
    for endpoint_id, url in targets:
        add_delivery(session=session, message=message, endpoint_id=endpoint_id, url=url)
    session.flush()
    return message


def add_message(
    *, session: Session, project_id: uuid.UUID, job_id: uuid.UUID | None, event_type: str, data: dict[str, Any]
) -> WebhookMessage:
    now = utcnow()
    message = WebhookMessage(
        id=uuid.uuid4(),
        project_id=project_id,
        job_id=job_id,
        event_type=event_type,
        payload={"type": event_type, "timestamp": now.isoformat(), "data": data},
        created_at=now,
    )
    session.add(message)
    return message


def add_delivery(
    *, session: Session, message: WebhookMessage, endpoint_id: uuid.UUID | None, url: str
) -> WebhookDelivery:
    delivery = WebhookDelivery(
        message=message,
        endpoint_id=endpoint_id,
        url=url,
        status=DeliveryStatus.pending,
        next_attempt_at=utcnow(),
    )
    session.add(delivery)
    return delivery
