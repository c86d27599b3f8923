"""Response and request bodies of the HTTP API (what the OpenAPI document shows)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import AfterValidator, AnyUrl, BaseModel, ConfigDict, Field, UrlConstraints

from jobs.models import DatasetKind, DatasetStatus, DeliveryStatus, JobStatus, ModelStatus
from jobs.outbox import EVENT_TYPES
from jobs.recipe import Recipe

T = TypeVar("T")


def _as_utc(value: datetime) -> datetime:
    """Times are stored in UTC, but SQLite returns them without an offset: add it, so every time
    the API sends is an RFC 3339 `date-time` (PostgreSQL's already carry one)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


# On the time fields only: a validator on every field ("*") ran once per field of every row listed.
UtcDatetime = Annotated[datetime, AfterValidator(_as_utc)]


class _Public(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class TensorInfo(BaseModel):
    name: str
    dtype: str
    shape: list[int | str | None] = Field(description="Fixed sizes as integers, symbolic dimensions by name.")


class InputInfo(TensorInfo):
    batch_axis: int | None = Field(
        0,
        description="The axis a dataset's array holds this input's samples along: 0 usually, 1 for a "
        "recurrent state declared (2, batch, 128); null for a constant input (a scalar sample rate), whose "
        "array is the value itself.",
    )


class ModelInfo(BaseModel):
    opset: int
    ir_version: int
    producer: str
    inputs: list[InputInfo]
    outputs: list[TensorInfo]
    op_histogram: dict[str, int]
    num_parameters: int
    num_nodes: int


class ModelPublic(_Public):
    id: uuid.UUID
    filename: str
    status: ModelStatus
    error: str | None
    sha256: str
    size_bytes: int
    info: ModelInfo | None
    created_at: UtcDatetime


class ArrayInfo(BaseModel):
    name: str
    dtype: str
    shape: list[int]


class ImageSetInfo(BaseModel):
    num_images: int
    formats: dict[str, int] = Field(description="Images per format: jpeg, png.")
    classes: list[str] = Field(description="Class id i is classes[i]; empty when the images are unlabelled.")
    label_source: Literal["folders", "csv"] | None = Field(
        description="folders: one folder per class, ids in sorted folder order; csv: labels.csv `file,label`."
    )
    expanded_bytes: int


class DatasetPublic(_Public):
    id: uuid.UUID
    filename: str
    kind: DatasetKind = Field(description="arrays: an .npz of named input arrays; images: a zip of JPEG/PNG.")
    status: DatasetStatus = Field(description="Image datasets are pending until a worker has decoded every image.")
    error: str | None = None
    sha256: str
    size_bytes: int = Field(
        description="What counts against the storage quota: the upload, or an .npz's arrays decompressed if larger."
    )
    arrays: list[ArrayInfo] = Field(description="The .npz's arrays (a scalar has shape []); empty for images.")
    images: ImageSetInfo | None = None
    num_samples: int | None = Field(
        description="Images; or the arrays' common first-axis length. null when the arrays share none: "
        "samples then run along each model input's batch axis (`ModelInfo.inputs[].batch_axis`), "
        "counted when a job pairs the dataset with a model."
    )
    created_at: UtcDatetime


WebhookUrl = Annotated[AnyUrl, UrlConstraints(max_length=2048, allowed_schemes=["http", "https"], host_required=True)]
EventType = Literal[EVENT_TYPES]  # job.succeeded | job.failed | job.canceled


class JobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_id: uuid.UUID
    dataset_id: uuid.UUID
    recipe: Recipe = Field(default_factory=Recipe)
    webhook_url: WebhookUrl | None = Field(
        default=None,
        description="Also notify this http(s) URL when the job ends (one-off; signed with `webhook_secret`, "
        "returned once in the response).",
    )


class JobPublic(_Public):
    id: uuid.UUID
    model_id: uuid.UUID
    dataset_id: uuid.UUID
    recipe: dict[str, Any]
    status: JobStatus
    stage: str | None
    progress: float = Field(ge=0.0, le=1.0)
    error: str | None
    attempts: int
    created_at: UtcDatetime
    updated_at: UtcDatetime
    started_at: UtcDatetime | None
    finished_at: UtcDatetime | None
    webhook_url: str | None = None
    engine_status: str | None = Field(
        default=None,
        description="TensorRT engine stage: queued | running (handed to a GPU worker), built | skipped | failed",
    )
    engine_reason: str | None = Field(default=None, description="Why the engine was not built, when it was not")
    engine_worker: str | None = Field(default=None, description="The worker node that built (or tried to build) it")
    engine_gpu: str | None = Field(default=None, description="That worker's GPU")
    engine_tensorrt_version: str | None = None


class JobCreated(JobPublic):
    webhook_secret: str | None = Field(
        default=None, description="Signs the one-off webhook (Standard Webhooks). Shown only in this response."
    )


class ArtifactPublic(_Public):
    name: str
    media_type: str
    size_bytes: int
    sha256: str
    url: str


class EventPublic(_Public):
    id: int
    kind: str
    stage: str | None
    progress: float | None
    message: str
    data: dict[str, Any] | None
    created_at: UtcDatetime


class Page(BaseModel, Generic[T]):
    items: list[T]
    next_cursor: str | None = Field(description="Pass as `cursor` to get the next page; null on the last page.")


class Health(BaseModel):
    status: str
    database: str
    broker: str


class WebhookCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: WebhookUrl
    event_types: list[EventType] = Field(default_factory=lambda: list(EVENT_TYPES), min_length=1)
    description: str = Field(default="", max_length=500)


class WebhookUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: WebhookUrl | None = None
    event_types: list[EventType] | None = Field(default=None, min_length=1)
    description: str | None = Field(default=None, max_length=500)
    enabled: bool | None = None


class SecretRotation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    overlap_seconds: float = Field(
        default=24 * 3600, ge=0, le=7 * 24 * 3600, description="How long the previous secret keeps signing too."
    )


class WebhookPublic(_Public):
    id: uuid.UUID
    url: str
    description: str
    event_types: list[str]
    enabled: bool
    disabled_reason: str | None
    failing_since: UtcDatetime | None
    previous_secret_expires_at: UtcDatetime | None = Field(
        description="While in the future, deliveries carry a signature with the previous secret too."
    )
    created_at: UtcDatetime
    updated_at: UtcDatetime


class WebhookWithSecret(WebhookPublic):
    secret: str = Field(description="`whsec_` + base64 key. Shown only when created or rotated.")


class AttemptPublic(_Public):
    attempted_at: UtcDatetime
    status_code: int | None
    latency_ms: float | None
    response: str | None = Field(description="The first 1024 characters of the receiver's answer.")
    error: str | None


class DeliveryPublic(_Public):
    id: uuid.UUID
    webhook_id: str = Field(description="The `webhook-id` header: the same on every attempt and replay.")
    event_type: str
    endpoint_id: uuid.UUID | None = Field(description="Null for a job's one-off webhook_url.")
    job_id: uuid.UUID | None
    url: str
    status: DeliveryStatus
    attempts: int
    next_attempt_at: UtcDatetime | None
    last_error: str | None
    created_at: UtcDatetime
    attempt_log: list[AttemptPublic]


class RecipeSummary(BaseModel):
    platform: str | None
    precision: str | None
    observer: str | None
    percentile: float | None = Field(description="With observer percentile: the |x| percentile taken as range.")
    calibration_samples: int | None
    reconstruction: dict[str, Any] | None = Field(description="The recipe's reconstruction section, when it has one.")
    target: dict[str, Any] | None = Field(description="The recipe's accuracy target, when it states one.")
    strategy: str = Field("fixed", description="fixed, or auto: the recipe was a starting point for a search.")
    auto: dict[str, Any] | None = Field(
        None, description="With strategy auto: the recipe's auto section (budget, objective, candidates)."
    )


class ComparisonMetrics(BaseModel):
    top1_fp32: float | None = Field(description="Top-1 in [0, 1] of the FP32 model on the held-out samples.")
    top1_quantized: float | None = Field(description="Top-1 of the QDQ model, exact QDQ arithmetic.")
    top1_deployed: float | None = Field(description="Top-1 of the QDQ model on the CPU EP's integer kernels.")
    top1_drop: float | None = Field(description="(top1_fp32 - top1_quantized) x 100, in points.")
    sqnr_db_min: float | None = Field(description="Lowest per-output SQNR (dB), exact QDQ vs FP32.")
    cosine_min: float | None = Field(description="Lowest per-output cosine similarity, exact QDQ vs FP32.")
    argmax_agreement_min: float | None = Field(description="Lowest per-output argmax agreement with FP32.")
    num_samples: int | None = Field(description="Held-out samples the figures were measured on.")
    target_met: bool | None = Field(
        None, description="With an accuracy target in the recipe: whether the model kept meets it."
    )


class ComparisonSize(BaseModel):
    fp32_bytes: float | None
    quantized_bytes: float | None


class ComparisonLatency(BaseModel):
    fp32_p50_ms: float | None = Field(description="FP32 median latency at batch 1, ONNX Runtime CPU EP.")
    quantized_p50_ms: float | None = Field(description="Quantized median latency at batch 1, ONNX Runtime CPU EP.")


class ComparisonRow(BaseModel):
    job_id: uuid.UUID
    status: JobStatus
    error: str | None
    dataset_id: uuid.UUID
    created_at: UtcDatetime
    finished_at: UtcDatetime | None
    recipe: RecipeSummary
    metrics: ComparisonMetrics | None = Field(description="Null until the job has a report.")
    size: ComparisonSize | None
    latency: ComparisonLatency | None
    artifacts: list[ArtifactPublic]
    report_url: str | None = Field(description="The full report (JSON), when the job has one.")


class ModelComparison(BaseModel):
    model_id: uuid.UUID
    filename: str
    size_bytes: int = Field(description="The uploaded FP32 model file.")
    items: list[ComparisonRow] = Field(description="The model's jobs, newest first.")
    next_cursor: str | None = Field(description="Pass as `cursor` to get the next page; null on the last page.")


class ApiKeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="", max_length=200, description="A label to tell keys apart, e.g. 'CI'.")


class ApiKeyPublic(_Public):
    id: uuid.UUID
    name: str
    prefix: str = Field(description="The key's first characters; the key itself is never shown again.")
    created_at: UtcDatetime
    last_used_at: UtcDatetime | None
    revoked_at: UtcDatetime | None


class ApiKeyCreated(ApiKeyPublic):
    key: str = Field(description="The API key. Shown only in this response: store it now.")
