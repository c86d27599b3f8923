"""Response and request bodies of the HTTP API (what the OpenAPI document shows)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from jobs.models import JobStatus, ModelStatus
from jobs.recipe import Recipe

T = TypeVar("T")


class _Public(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class TensorInfo(BaseModel):
    name: str
    dtype: str
    shape: list[int | str | None] = Field(description="Fixed sizes as integers, symbolic dimensions by name.")


class ModelInfo(BaseModel):
    opset: int
    ir_version: int
    producer: str
    inputs: list[TensorInfo]
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
    created_at: datetime


class ArrayInfo(BaseModel):
    name: str
    dtype: str
    shape: list[int]


class DatasetPublic(_Public):
    id: uuid.UUID
    filename: str
    sha256: str
    size_bytes: int
    arrays: list[ArrayInfo]
    num_samples: int
    created_at: datetime


class JobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_id: uuid.UUID
    dataset_id: uuid.UUID
    recipe: Recipe = Field(default_factory=Recipe)


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
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


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
    created_at: datetime


class Page(BaseModel, Generic[T]):
    items: list[T]
    next_cursor: str | None = Field(description="Pass as `cursor` to get the next page; null on the last page.")


class Health(BaseModel):
    status: str
    database: str
    broker: str
