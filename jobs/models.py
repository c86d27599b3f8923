"""SQLAlchemy 2 models: the service's source of truth.

    Project ─┬─ ApiKey            (only a SHA-256 of the key is stored)
             ├─ Model             (an uploaded ONNX file, validated by a task)
             ├─ Dataset           (an uploaded .npz of named input arrays, or a zip of images)
             ├─ Job ─┬─ JobEvent  (stage / progress / log, the SSE stream; id is the event id)
             │       └─ Artifact  (files a job produced, under the storage root)
             ├─ WebhookEndpoint   (a URL, the event types it wants, its signing secret(s))
             └─ WebhookMessage ── WebhookDelivery ── WebhookAttempt
                (the outbox: one message per event, one delivery per target, one attempt per request)
    Worker                        (a live worker node and its GPU/TensorRT capabilities; no project)

Job status: queued → running → succeeded | failed | canceled, with canceling between running
and canceled. Terminal states never change again (enforced in `jobs.queries`).
"""

from __future__ import annotations

import enum
import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    Uuid,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class JobStatus(enum.StrEnum):
    queued = "queued"
    running = "running"
    canceling = "canceling"
    succeeded = "succeeded"
    failed = "failed"
    canceled = "canceled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset({JobStatus.succeeded, JobStatus.failed, JobStatus.canceled})


class ModelStatus(enum.StrEnum):
    pending = "pending"  # uploaded, waiting for the validation task
    ready = "ready"
    invalid = "invalid"


class DatasetKind(enum.StrEnum):
    arrays = "arrays"  # .npz of named input arrays
    images = "images"  # zip of JPEG/PNG images, turned into arrays by the recipe's preprocessing


# Image datasets are checked by a task as models are (every image decoded); .npz ones are ready at once.
DatasetStatus = ModelStatus


def _enum(cls: type[enum.Enum], name: str) -> Enum:
    # Stored as plain strings (no native PG enum) so adding a value needs no type migration.
    return Enum(cls, name=name, native_enum=False, length=16, validate_strings=True)


class Project(Base):
    __tablename__ = "projects"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # Per-project quotas; None means the settings' defaults (`quota_storage_bytes`, `quota_concurrent_jobs`).
    max_storage_bytes: Mapped[int | None] = mapped_column(BigInteger)
    max_concurrent_jobs: Mapped[int | None] = mapped_column(Integer)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    project_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    # The first characters of the key, shown in listings so a user can tell keys apart.
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    project: Mapped[Project] = relationship()


class Model(Base):
    __tablename__ = "models"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    project_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    filename: Mapped[str] = mapped_column(String(255))
    status: Mapped[ModelStatus] = mapped_column(_enum(ModelStatus, "model_status"), default=ModelStatus.pending)
    error: Mapped[str | None] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    # Path relative to the storage root.
    path: Mapped[str] = mapped_column(String(1024))
    # inputs/outputs (name, dtype, shape with symbolic dims as strings; inputs also their batch_axis),
    # opset, op histogram, parameters (`quantcore.inspect_model`).
    info: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Validation messages sent (the upload's included) and when the last re-send went (None: only the
    # upload's, at created_at); the reaper re-sends a lost one (`jobs.revalidation`).
    validation_attempts: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    validation_sent_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Dataset(Base):
    __tablename__ = "datasets"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    project_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    filename: Mapped[str] = mapped_column(String(255))
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    path: Mapped[str] = mapped_column(String(1024))
    # [{"name", "dtype", "shape"}] for every array in the archive. [] for images.
    arrays: Mapped[list[Any]] = mapped_column(JSON)
    # Images; or the arrays' common first-axis length. None when they have none: samples then run along
    # each model input's own batch axis, counted when a job pairs the dataset with a model (`jobs.dataset_fit`).
    num_samples: Mapped[int | None] = mapped_column(Integer)
    kind: Mapped[DatasetKind] = mapped_column(
        _enum(DatasetKind, "dataset_kind"), default=DatasetKind.arrays, server_default=DatasetKind.arrays.value
    )
    status: Mapped[DatasetStatus] = mapped_column(
        _enum(DatasetStatus, "dataset_status"), default=DatasetStatus.ready, server_default=DatasetStatus.ready.value
    )
    error: Mapped[str | None] = mapped_column(Text)
    # Image datasets: {num_images, formats, classes, label_source, expanded_bytes} (jobs.archives).
    images: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # As on Model: validation messages sent and when the last re-send went (image datasets only).
    validation_attempts: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    validation_sent_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_project_created", "project_id", "created_at", "id"),)

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    project_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    model_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("models.id", ondelete="RESTRICT"), index=True)
    dataset_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("datasets.id", ondelete="RESTRICT"), index=True)
    recipe: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[JobStatus] = mapped_column(_enum(JobStatus, "job_status"), default=JobStatus.queued, index=True)
    stage: Mapped[str | None] = mapped_column(String(32))
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    error: Mapped[str | None] = mapped_column(Text)
    # Claim bookkeeping: which process runs the job, how often it was started, when it last beat.
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    claimed_by: Mapped[str | None] = mapped_column(String(255))
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    # A one-off webhook for this job's end, signed with its own secret (shown once at creation).
    webhook_url: Mapped[str | None] = mapped_column(String(2048))
    webhook_secret: Mapped[str | None] = mapped_column(String(100))
    # TensorRT engine stage: where it ran and how it ended (`worker.engine_routing`). engine_status is
    # queued | running while handed off to an `engine`-queue worker, then built | skipped | failed;
    # engine_request identifies the current hand-off so a late task of an abandoned one does nothing.
    engine_status: Mapped[str | None] = mapped_column(String(16))
    engine_reason: Mapped[str | None] = mapped_column(Text)
    engine_worker: Mapped[str | None] = mapped_column(String(255))
    engine_gpu: Mapped[str | None] = mapped_column(String(255))
    engine_tensorrt_version: Mapped[str | None] = mapped_column(String(64))
    engine_request: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    model: Mapped[Model] = relationship()
    dataset: Mapped[Dataset] = relationship()


class Worker(Base):
    """A running Celery worker node and what it can do, registered at start and refreshed by a heartbeat.

    engine_capable: it consumes the `engine` queue and its probe found CUDA and TensorRT; otherwise
    `reason` says why not. A row whose heartbeat is older than `worker_heartbeat_timeout` is a worker
    that died without deregistering.
    """

    __tablename__ = "workers"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)  # the Celery node name, e.g. gpu0@host
    hostname: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    queues: Mapped[list[Any]] = mapped_column(JSON)
    engine_capable: Mapped[bool] = mapped_column(Boolean, default=False)
    reason: Mapped[str | None] = mapped_column(Text)
    gpu_name: Mapped[str | None] = mapped_column(String(255))
    compute_capability: Mapped[str | None] = mapped_column(String(16))
    tensorrt_version: Mapped[str | None] = mapped_column(String(64))
    # The whole probe: CUDA runtime/driver versions, memory, ...
    capabilities: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)


class JobEvent(Base):
    __tablename__ = "job_events"
    # A worker numbers the events of its attempt, so writing one twice (a transaction retried after
    # the connection died during a COMMIT that went through) finds the first and adds nothing.
    # Events without a number (API, reaper) never collide: NULLs are distinct in a unique constraint.
    __table_args__ = (UniqueConstraint("job_id", "attempt", "sequence", name="uq_job_events_attempt_sequence"),)

    # Monotonic across the table: the SSE event id, so Last-Event-ID resumes exactly.
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int | None] = mapped_column(Integer)  # the job's `attempts` when its worker wrote it
    sequence: Mapped[int | None] = mapped_column(Integer)  # its number within that attempt, from 0
    kind: Mapped[str] = mapped_column(String(16))  # status | stage | progress | log
    stage: Mapped[str | None] = mapped_column(String(32))
    progress: Mapped[float | None] = mapped_column(Float)
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Artifact(Base):
    __tablename__ = "artifacts"
    __table_args__ = (UniqueConstraint("job_id", "name", name="uq_artifacts_job_name"),)

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(255))
    media_type: Mapped[str] = mapped_column(String(100))
    path: Mapped[str] = mapped_column(String(1024))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class StageDurationBucket(Base):
    """A Prometheus histogram of stage durations kept in SQL, so every worker on every host feeds it.

    One row per (stage, upper bound `le` in seconds, +inf included): `count` and `sum_seconds` of the
    completed stage runs that took at most `le`. A run adds itself to every row with `le >= seconds`
    in one UPDATE, so the rows are the cumulative buckets as the exposition format wants them.
    """

    __tablename__ = "stage_duration_buckets"

    stage: Mapped[str] = mapped_column(String(32), primary_key=True)
    le: Mapped[float] = mapped_column(Float, primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger, default=0)
    sum_seconds: Mapped[float] = mapped_column(Float, default=0.0)


class DeliveryStatus(enum.StrEnum):
    pending = "pending"  # waiting for its next_attempt_at
    succeeded = "succeeded"  # the receiver answered 2xx
    failed = "failed"  # retries exhausted, endpoint gone (410) or disabled


class WebhookEndpoint(Base):
    __tablename__ = "webhook_endpoints"
    __table_args__ = (Index("ix_webhook_endpoints_project_created", "project_id", "created_at", "id"),)

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    project_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    url: Mapped[str] = mapped_column(String(2048))
    description: Mapped[str] = mapped_column(String(500), default="")
    event_types: Mapped[list[Any]] = mapped_column(JSON)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    disabled_reason: Mapped[str | None] = mapped_column(Text)
    # `whsec_` + base64 key. During a rotation's overlap the previous secret signs too.
    secret: Mapped[str] = mapped_column(String(100))
    previous_secret: Mapped[str | None] = mapped_column(String(100))
    previous_secret_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Start of the current run of failed attempts; None after a success.
    failing_since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)


class WebhookMessage(Base):
    """One event, written in the transaction that caused it; `id` is the stable `webhook-id`."""

    __tablename__ = "webhook_messages"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    project_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    event_type: Mapped[str] = mapped_column(String(64))
    # The body sent, as {type, timestamp, data}; identical on every attempt.
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class WebhookDelivery(Base):
    """A message on its way to one target: an endpoint, or a job's one-off `webhook_url`."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),
        Index("ix_webhook_deliveries_endpoint_created", "endpoint_id", "created_at", "id"),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    message_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("webhook_messages.id", ondelete="CASCADE"), index=True)
    endpoint_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("webhook_endpoints.id", ondelete="CASCADE"))
    url: Mapped[str] = mapped_column(String(2048))
    status: Mapped[DeliveryStatus] = mapped_column(
        _enum(DeliveryStatus, "delivery_status"), default=DeliveryStatus.pending
    )
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # When the poller may send it next; pushed forward by a lease while an attempt is in flight.
    next_attempt_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Which poll claimed the in-flight attempt: a stale task whose claim was taken over does nothing.
    claim: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)

    message: Mapped[WebhookMessage] = relationship()
    attempt_log: Mapped[list[WebhookAttempt]] = relationship(
        order_by="WebhookAttempt.attempted_at", lazy="selectin", cascade="all, delete-orphan", passive_deletes=True
    )


class WebhookAttempt(Base):
    __tablename__ = "webhook_attempts"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    delivery_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), index=True)
    attempted_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    status_code: Mapped[int | None] = mapped_column(Integer)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    # The first bytes of the receiver's answer, decoded leniently.
    response: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
