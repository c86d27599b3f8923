"""Service-wide counts for `/metrics`, across every project (an operator's view, never a user's).

Both are one GROUP BY over an indexed status column (`ix_jobs_status`, `ix_webhook_deliveries_due`),
answered from the index; statuses with no rows are reported as 0 so every series always exists.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from jobs.models import DeliveryStatus, Job, JobStatus, WebhookDelivery


def jobs_by_status(*, session: Session) -> dict[str, int]:
    counts = {status.value: 0 for status in JobStatus}
    for status, count in session.execute(select(Job.status, func.count()).group_by(Job.status)):
        counts[JobStatus(status).value] = int(count)
    return counts


def deliveries_by_status(*, session: Session) -> dict[str, int]:
    counts = {status.value: 0 for status in DeliveryStatus}
    query = select(WebhookDelivery.status, func.count()).group_by(WebhookDelivery.status)
    for status, count in session.execute(query):
        counts[DeliveryStatus(status).value] = int(count)
    return counts
