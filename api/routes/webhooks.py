"""`/webhooks`: endpoints (CRUD, secret rotation, test ping), their deliveries and attempts, replay.

Targets are checked against SSRF when saved (and again by the worker before every attempt).
Secrets appear in a response only when created or rotated.
"""

from __future__ import annotations

import logging
import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Response

from api.deps import CeleryDep, ProjectDep, SessionDep, SettingsDep
from api.pagination import CursorQuery, LimitQuery, page
from api.problems import Problem
from api.schemas import (
    DeliveryPublic,
    Page,
    SecretRotation,
    WebhookCreate,
    WebhookPublic,
    WebhookUpdate,
    WebhookWithSecret,
)
from jobs import webhooks
from jobs.config import Settings
from jobs.models import WebhookDelivery, WebhookEndpoint
from jobs.outbox import webhook_id
from jobs.queue import enqueue_webhook_poll
from jobs.ssrf import UnsafeTarget, check_url

router = APIRouter(prefix="/webhooks", tags=["webhooks"])
log = logging.getLogger(__name__)


def check_target(url: str, settings: Settings, field: str) -> None:
    """422 naming `field` when the URL resolves to an address webhooks may not reach."""
    try:
        check_url(url, allowed=settings.allowed_webhook_networks)
    except UnsafeTarget as exc:
        raise Problem(
            422, f"{field}: {exc}", slug="webhook-target-refused", errors=[{"field": field, "message": str(exc)}]
        ) from exc


def _endpoint_or_404(session: SessionDep, project: ProjectDep, webhook_id: uuid.UUID) -> WebhookEndpoint:
    endpoint = webhooks.get_endpoint(session=session, project_id=project.id, endpoint_id=webhook_id)
    if endpoint is None:
        raise Problem(404, f"webhook {webhook_id} not found", slug="webhook-not-found")
    return endpoint


def _delivery_out(delivery: WebhookDelivery) -> DeliveryPublic:
    return DeliveryPublic(
        id=delivery.id,
        webhook_id=webhook_id(delivery.message_id),
        event_type=delivery.message.event_type,
        endpoint_id=delivery.endpoint_id,
        job_id=delivery.message.job_id,
        url=delivery.url,
        status=delivery.status,
        attempts=delivery.attempts,
        next_attempt_at=delivery.next_attempt_at,
        last_error=delivery.last_error,
        created_at=delivery.created_at,
        attempt_log=delivery.attempt_log,
    )


def _send_soon(celery: CeleryDep) -> None:
    # Only a nudge: the periodic poll sends the delivery anyway if the broker is unreachable now.
    try:
        enqueue_webhook_poll(celery)
    except Exception:
        log.warning("could not nudge the webhook poller; the next beat will send", exc_info=True)


def _refuse_if_disabled(endpoint: WebhookEndpoint) -> None:
    if not endpoint.enabled:
        raise Problem(
            409,
            f"webhook {endpoint.id} is disabled ({endpoint.disabled_reason}); enable it with PATCH first",
            slug="webhook-disabled",
        )


@router.post("", status_code=201, response_model=WebhookWithSecret, summary="Register a webhook endpoint")
def create_webhook(
    body: WebhookCreate, session: SessionDep, project: ProjectDep, settings: SettingsDep
) -> WebhookEndpoint:
    """The response carries the signing secret; it is not shown again (rotate it to get a new one)."""
    url = str(body.url)
    check_target(url, settings, "url")
    endpoint = webhooks.create_endpoint(
        session=session, project_id=project.id, url=url, event_types=body.event_types, description=body.description
    )
    session.commit()
    return endpoint


@router.get("", response_model=Page[WebhookPublic], summary="List webhook endpoints, newest first")
def list_webhooks(session: SessionDep, project: ProjectDep, limit: LimitQuery = 50, cursor: CursorQuery = None) -> dict:
    return page(webhooks.list_endpoints, session=session, project_id=project.id, limit=limit, cursor=cursor)


@router.get("/deliveries", response_model=Page[DeliveryPublic], summary="All deliveries of the project")
def list_all_deliveries(
    session: SessionDep,
    project: ProjectDep,
    job_id: Annotated[uuid.UUID | None, Query(description="Only the deliveries announcing this job.")] = None,
    limit: LimitQuery = 50,
    cursor: CursorQuery = None,
) -> dict:
    """Includes jobs' one-off `webhook_url` deliveries, which belong to no endpoint."""
    result = page(
        webhooks.list_deliveries, session=session, project_id=project.id, job_id=job_id, limit=limit, cursor=cursor
    )
    return {**result, "items": [_delivery_out(d) for d in result["items"]]}


@router.post(
    "/deliveries/{delivery_id}/replay",
    status_code=202,
    response_model=DeliveryPublic,
    summary="Send any delivery's message again (one-off job webhooks included)",
)
def replay_any_delivery(
    session: SessionDep, project: ProjectDep, celery: CeleryDep, delivery_id: uuid.UUID
) -> DeliveryPublic:
    delivery = webhooks.get_delivery(session=session, project_id=project.id, delivery_id=delivery_id)
    if delivery is None:
        raise Problem(404, f"delivery {delivery_id} not found", slug="delivery-not-found")
    url = delivery.url
    if delivery.endpoint_id is not None:
        endpoint = _endpoint_or_404(session, project, delivery.endpoint_id)
        _refuse_if_disabled(endpoint)
        url = endpoint.url
    copy = webhooks.replay(session=session, delivery=delivery, url=url)
    session.commit()
    _send_soon(celery)
    return _delivery_out(copy)


@router.get("/{webhook_id}", response_model=WebhookPublic, summary="Read a webhook endpoint")
def read_webhook(session: SessionDep, project: ProjectDep, webhook_id: uuid.UUID) -> WebhookEndpoint:
    return _endpoint_or_404(session, project, webhook_id)


@router.patch("/{webhook_id}", response_model=WebhookPublic, summary="Change URL, event types, description, enabled")
def update_webhook(
    body: WebhookUpdate, session: SessionDep, project: ProjectDep, settings: SettingsDep, webhook_id: uuid.UUID
) -> WebhookEndpoint:
    """Re-enabling a disabled endpoint clears its failure history; deliveries it missed can be replayed."""
    endpoint = _endpoint_or_404(session, project, webhook_id)
    changes = body.model_dump(exclude_unset=True, exclude_none=True)
    if "url" in changes:
        changes["url"] = str(body.url)
        check_target(changes["url"], settings, "url")
    webhooks.update_endpoint(session=session, endpoint=endpoint, changes=changes)
    session.commit()
    return endpoint


@router.delete("/{webhook_id}", status_code=204, summary="Delete a webhook endpoint and its delivery log")
def delete_webhook(session: SessionDep, project: ProjectDep, webhook_id: uuid.UUID) -> Response:
    webhooks.delete_endpoint(session=session, endpoint=_endpoint_or_404(session, project, webhook_id))
    session.commit()
    return Response(status_code=204)


@router.post("/{webhook_id}/rotate-secret", response_model=WebhookWithSecret, summary="Replace the signing secret")
def rotate_secret(
    session: SessionDep, project: ProjectDep, webhook_id: uuid.UUID, body: SecretRotation | None = None
) -> WebhookEndpoint:
    """The new secret signs at once; the previous one signs too for `overlap_seconds` (default a day),
    so `webhook-signature` carries two `v1,` signatures until the receiver has switched."""
    endpoint = _endpoint_or_404(session, project, webhook_id)
    overlap = (body or SecretRotation()).overlap_seconds
    webhooks.rotate_secret(session=session, endpoint=endpoint, overlap_seconds=overlap)
    session.commit()
    return endpoint


@router.post("/{webhook_id}/test", status_code=202, response_model=DeliveryPublic, summary="Send a ping")
def send_test(session: SessionDep, project: ProjectDep, celery: CeleryDep, webhook_id: uuid.UUID) -> DeliveryPublic:
    """Queues a `webhook.ping` message to this endpoint; follow it in its deliveries."""
    endpoint = _endpoint_or_404(session, project, webhook_id)
    _refuse_if_disabled(endpoint)
    delivery = webhooks.send_ping(session=session, endpoint=endpoint)
    session.commit()
    _send_soon(celery)
    return _delivery_out(delivery)


@router.get("/{webhook_id}/deliveries", response_model=Page[DeliveryPublic], summary="Deliveries and their attempts")
def list_deliveries(
    session: SessionDep, project: ProjectDep, webhook_id: uuid.UUID, limit: LimitQuery = 50, cursor: CursorQuery = None
) -> dict:
    endpoint = _endpoint_or_404(session, project, webhook_id)
    result = page(
        webhooks.list_deliveries,
        session=session,
        project_id=project.id,
        endpoint_id=endpoint.id,
        limit=limit,
        cursor=cursor,
    )
    return {**result, "items": [_delivery_out(d) for d in result["items"]]}


def _delivery_or_404(
    session: SessionDep, project: ProjectDep, endpoint: WebhookEndpoint, delivery_id: uuid.UUID
) -> WebhookDelivery:
    delivery = webhooks.get_delivery(
        session=session, project_id=project.id, delivery_id=delivery_id, endpoint_id=endpoint.id
    )
    if delivery is None:
        raise Problem(404, f"delivery {delivery_id} not found for webhook {endpoint.id}", slug="delivery-not-found")
    return delivery


@router.get("/{webhook_id}/deliveries/{delivery_id}", response_model=DeliveryPublic, summary="Read one delivery")
def read_delivery(
    session: SessionDep, project: ProjectDep, webhook_id: uuid.UUID, delivery_id: uuid.UUID
) -> DeliveryPublic:
    endpoint = _endpoint_or_404(session, project, webhook_id)
    return _delivery_out(_delivery_or_404(session, project, endpoint, delivery_id))


@router.post(
    "/{webhook_id}/deliveries/{delivery_id}/replay",
    status_code=202,
    response_model=DeliveryPublic,
    summary="Send a delivery's message again",
)
def replay_delivery(
    session: SessionDep, project: ProjectDep, celery: CeleryDep, webhook_id: uuid.UUID, delivery_id: uuid.UUID
) -> DeliveryPublic:
    """A new delivery of the same message (same `webhook-id`, so receivers can deduplicate) to the
    endpoint's current URL, due now."""
    endpoint = _endpoint_or_404(session, project, webhook_id)
    delivery = _delivery_or_404(session, project, endpoint, delivery_id)
    _refuse_if_disabled(endpoint)
    copy = webhooks.replay(session=session, delivery=delivery, url=endpoint.url)
    session.commit()
    _send_soon(celery)
    return _delivery_out(copy)
