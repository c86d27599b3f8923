"""Stage durations as a Prometheus histogram kept in SQL (`stage_duration_buckets`).

Workers run on other processes and hosts than the API that serves `/metrics`, so the histogram
lives in the database: a stage run that completes adds itself, in the transaction that records
the next stage (or the job's success), to every bucket row with `le >= seconds`:

    UPDATE stage_duration_buckets SET count = count + 1, sum_seconds = sum_seconds + :s
     WHERE stage = :stage AND le >= :s

One atomic statement per stage run (no read-modify-write race between workers), a table of
(stages x buckets) rows whatever the number of jobs (a scrape reads ~100 rows), and counts that
survive restarts of any process, as counters should.

A stage's duration is the time from its `stage` event to the next boundary of the same attempt,
both read from the events' own timestamps.
The claim of a new attempt writes a `status` event, so a stage interrupted by a crash is never
measured across the gap.
"""

from __future__ import annotations

import math
import uuid
from collections import defaultdict
from datetime import UTC, datetime

from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from jobs.models import JobEvent, StageDurationBucket

# Upper bounds in seconds: quantization stages run from under a second (annotate) to hours
# (reconstruction, engine builds on large models).
BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, math.inf)


def observe(*, session: Session, stage: str, seconds: float) -> None:
    """Add one completed run of `stage` that took `seconds` (>= 0) to the histogram."""
    seconds = max(0.0, seconds)
    add = (
        update(StageDurationBucket)
        .where(StageDurationBucket.stage == stage, StageDurationBucket.le >= seconds)
        .values(count=StageDurationBucket.count + 1, sum_seconds=StageDurationBucket.sum_seconds + seconds)
        .execution_options(synchronize_session=False)
    )
    if session.execute(add).rowcount:
        return
    # First run of this stage anywhere: create its rows; a worker racing us to it makes the insert a no-op.
    dialect_insert = postgresql_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    rows = [{"stage": stage, "le": le, "count": 0, "sum_seconds": 0.0} for le in BUCKETS]
    session.execute(dialect_insert(StageDurationBucket).values(rows).on_conflict_do_nothing())
    session.execute(add)


def record_stage_end(*, session: Session, job_id: uuid.UUID, ended_at: datetime) -> None:
    """If the job's latest boundary event is a `stage` event, that stage ended at `ended_at`: observe it.

    `ended_at` is the `created_at` of the boundary event that ends it, so the histogram and the job's
    event stream give the same duration to the microsecond."""
    latest = session.execute(
        select(JobEvent.kind, JobEvent.stage, JobEvent.created_at)
        .where(JobEvent.job_id == job_id, JobEvent.kind.in_(("stage", "status")))
        .order_by(JobEvent.id.desc())
        .limit(1)
    ).first()
    if latest is None or latest.kind != "stage" or not latest.stage:
        return
    started: datetime = latest.created_at
    if started.tzinfo is None:  # SQLite hands back naive datetimes; they were written in UTC
        started = started.replace(tzinfo=UTC)
    observe(session=session, stage=latest.stage, seconds=(ended_at - started).total_seconds())


def histograms(*, session: Session) -> dict[str, list[tuple[float, int, float]]]:
    """{stage: [(le, cumulative count, cumulative sum), ...]} with le ascending, +inf last."""
    bucket = StageDurationBucket
    rows = session.execute(
        select(bucket.stage, bucket.le, bucket.count, bucket.sum_seconds).order_by(bucket.stage, bucket.le)
    ).all()
    result: dict[str, list[tuple[float, int, float]]] = defaultdict(list)
    for row in rows:
        result[row.stage].append((float(row.le), int(row.count), float(row.sum_seconds)))
    return dict(result)
