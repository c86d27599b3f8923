"""Service settings: one validated object, read from the environment and `.env`.

Every process (API, worker, migrations, CLI admin commands) imports `settings` from here.
Names map to environment variables in upper case with the `QUANT_` prefix, except the two
conventional ones, `DATABASE_URL` and `BROKER_URL`, which are read without a prefix too.

With nothing set, the service runs embedded: SQLite under `var/`, Redis at 127.0.0.1:6379
when it answers, otherwise kombu's filesystem transport under `var/broker`. `var/` and `.env` are
the checkout's (`HOME`), not the working directory's, and a relative `QUANT_VAR_DIR` or SQLite path
is taken from there too: an admin command run from another directory must find the same database,
not start an empty one beside it.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MiB = 1024 * 1024


def _home() -> Path:
    """The checkout this package runs from; the working directory for an installed wheel (where a
    deployment sets absolute paths, e.g. QUANT_VAR_DIR=/data)."""
    checkout = Path(__file__).resolve().parent.parent
    return checkout if (checkout / "pyproject.toml").is_file() else Path.cwd()


HOME = _home()


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="QUANT_", env_file=HOME / ".env", extra="ignore")

    environment: Literal["development", "test", "production"] = "development"
    var_dir: Path = Field(default=Path("var"), validate_default=True)  # relative: from HOME
    database_url: str | None = Field(default=None, validation_alias=AliasChoices("DATABASE_URL", "QUANT_DATABASE_URL"))
    broker_url: str | None = Field(default=None, validation_alias=AliasChoices("BROKER_URL", "QUANT_BROKER_URL"))
    # Redis probed when broker_url is unset; the embedded filesystem broker otherwise.
    local_redis_url: str = "redis://127.0.0.1:6379/0"

    # Uploads
    max_model_bytes: int = 8192 * MiB  # beyond 2 GiB only as a zip with external data (jobs.model_archives)
    max_dataset_bytes: int = 1024 * MiB
    max_dataset_arrays: int = 64
    # `.npz` datasets (jobs.npz): the arrays' size once decompressed, which is what a job's worker holds
    # in memory (np.savez stores them uncompressed, so it is about the upload's size), and the archive's
    # compression ratio, taken over all arrays together: one constant mask compresses ~1000:1 and is
    # harmless, a gigabyte of zeros behind a megabyte upload is a zip bomb.
    max_dataset_expanded_bytes: int = Field(default=1024 * MiB, ge=1)
    max_dataset_ratio: float = Field(default=100.0, ge=1.0)
    min_opset: int = 7
    max_opset: int = 23
    # Image-zip datasets (jobs.archives): members, bytes per image and in all once expanded, the
    # highest compression ratio accepted (JPEG/PNG barely compress: a high ratio is a zip bomb), and
    # pixels per image (checked from the header before decoding).
    max_dataset_images: int = Field(default=100_000, ge=2)
    max_image_bytes: int = Field(default=64 * MiB, ge=1)
    max_images_expanded_bytes: int = Field(default=8192 * MiB, ge=1)
    max_archive_ratio: float = Field(default=100.0, ge=1.0)
    max_image_pixels: int = Field(default=50_000_000, ge=1)
    # A job's calibration + evaluation images, once preprocessed, are held in the worker's memory.
    max_decoded_image_bytes: int = Field(default=4096 * MiB, ge=1)
    # Seconds POST /models (and POST /datasets with images) waits for the validation task before
    # answering 202 (pending).
    validation_wait_seconds: float = 60.0
    # A model or image dataset still `pending` this long (seconds) after its validation message was
    # last sent, with that message in no broker queue (lost: broker restarted, worker killed after
    # acking), gets it sent again by the reaper; after validation_max_attempts messages in all (the
    # upload's included) it is marked invalid instead. A check waiting or running in Redis is never
    # re-sent; the embedded filesystem broker cannot be inspected, so there keep this above the
    # longest check (the dataset task's time limit is an hour).
    validation_resend_seconds: float = Field(default=900.0, gt=0.0)
    validation_max_attempts: int = Field(default=3, ge=1)

    # Storage (`jobs.storage`): unset, files under `<var_dir>/storage`; `s3://bucket/prefix`, an
    # S3-compatible store (credentials and region from the usual AWS variables), so that API and
    # workers may run on different hosts.
    storage_url: str | None = None
    storage_endpoint_url: str | None = None  # e.g. http://minio:9000; unset: AWS
    # Artifact downloads answer 307 to a presigned URL of the store, valid this long (s), instead of
    # streaming through the API (object stores only).
    storage_presign: bool = False
    storage_presign_seconds: int = Field(default=300, ge=1, le=7 * 24 * 3600)
    # Workers keep the models and datasets they fetch from an object store in a local cache, keyed by
    # SHA-256 and bounded in bytes (least recently used entries go first).
    cache_dir: Path | None = None  # unset: <var_dir>/cache
    cache_max_bytes: int = Field(default=20 * 1024 * MiB, ge=0)
    # The sweep (`worker.sweep`) removes objects no row references (a crash between storing and
    # recording) once they are older than this (s), and aborts multipart uploads as old; it runs this often.
    storage_sweep_grace_seconds: float = Field(default=24 * 3600, ge=0.0)
    storage_sweep_interval: float = Field(default=3600.0, gt=0.0)

    # Jobs
    job_soft_time_limit: int = 6 * 3600
    job_time_limit: int = 6 * 3600 + 300
    heartbeat_interval: float = 10.0
    # A running job whose heartbeat is older than this is considered orphaned by the reaper.
    heartbeat_timeout: float = 120.0
    reaper_interval: float = 30.0
    max_attempts: int = 3
    # A queued job older than this (seconds) whose message is in no broker queue lost it (a broker
    # restart without persistence): the reaper sends it again. Queued jobs behind a long queue keep
    # their message and are left alone.
    lost_message_timeout: float = Field(default=300.0, gt=0.0)
    # How long (seconds) a worker keeps retrying a database write through an outage before giving up.
    db_retry_seconds: float = Field(default=60.0, ge=0.0)
    # Celery workers add this to their niceness when they start (`worker.app`; relative, as `nice -n`,
    # capped at 19), so that an API on the same host keeps the CPU it needs to answer while jobs
    # quantize (on a 2-core machine, GET p99 222 ms with the job worker at the API's priority, 135 ms
    # 10 below it, measured by bench.load). It only matters when the CPU is contended; 0 leaves it alone.
    worker_nice: int = Field(default=10, ge=0, le=19)

    # TensorRT engine stage (`worker.engine_routing`). A job whose worker has no GPU with TensorRT hands the
    # build to a worker on the `engine` queue and waits at most this long for one to take it; then (or at
    # once when no capable worker is registered) the stage ends `skipped` with the reason.
    engine_wait_seconds: float = Field(default=600.0, ge=0.0)
    # Workers register in the `workers` table and refresh it this often; a registration older than
    # worker_heartbeat_timeout belongs to a dead worker.
    worker_heartbeat_interval: float = Field(default=15.0, gt=0.0)
    worker_heartbeat_timeout: float = Field(default=60.0, gt=0.0)

    # API
    cors_origins: list[str] = []
    page_size_max: int = 200
    # Base URL clients reach the API at; webhook payloads link to jobs, reports and artifacts under it.
    public_url: str = "http://127.0.0.1:8000"

    # Quotas per project (a project row's max_storage_bytes / max_concurrent_jobs override them).
    # Storage counts models + datasets + job artifacts; concurrent jobs are queued + running + canceling.
    quota_storage_bytes: int = Field(default=50 * 1024 * MiB, ge=0)
    quota_concurrent_jobs: int = Field(default=8, ge=0)
    # JSON (non-upload) request bodies larger than this get 413 before they are parsed.
    max_json_body_bytes: int = Field(default=1 * MiB, ge=1024)

    # Operations
    # Log lines as JSON objects (one per line) or as text; auto = JSON in production, text otherwise.
    log_format: Literal["auto", "json", "text"] = "auto"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # When set, GET /metrics wants `Authorization: Bearer <token>`; unset, it is open (bind it internally).
    metrics_token: str | None = None
    # The DB-derived metrics (jobs by state, stage durations, webhook outcomes) are cached this long (s),
    # so several scrapers or API processes do not multiply the queries.
    metrics_cache_seconds: float = Field(default=5.0, ge=0.0)

    # Webhooks
    # Seconds to wait before each attempt: the first at once, then growing (jittered) gaps, ~28 h in all.
    webhook_retry_schedule: list[float] = [0, 5, 300, 1800, 7200, 18000, 36000, 36000]
    # Each gap is scaled by a random factor in [1 - jitter, 1 + jitter] so retries do not arrive in herds.
    webhook_jitter: float = Field(default=0.1, ge=0.0, le=0.5)
    # Per attempt: connect + send + read the (truncated) answer.
    webhook_timeout: float = Field(default=15.0, gt=0.0, le=30.0)
    # The periodic task that sends due deliveries runs this often (seconds).
    webhook_poll_interval: float = Field(default=2.0, gt=0.0)
    webhook_poll_batch: int = Field(default=50, ge=1)
    # An endpoint whose deliveries have failed continuously for this long is disabled (seconds).
    webhook_disable_after: float = Field(default=5 * 24 * 3600, gt=0.0)
    # A receiver's Retry-After is honoured up to this many seconds.
    webhook_retry_after_max: float = Field(default=24 * 3600, ge=0.0)
    # CIDRs a webhook may target although they are loopback/private/link-local (e.g. ["127.0.0.1/32"]).
    # Empty by default: only public addresses are reachable.
    webhook_allowed_networks: list[str] = []

    @field_validator("var_dir")
    @classmethod
    def _var_dir_from_home(cls, value: Path) -> Path:
        return (HOME / value).resolve()

    @field_validator("database_url")
    @classmethod
    def _sqlite_path_from_home(cls, value: str | None) -> str | None:
        prefix = "sqlite:///"
        if value is None or not value.startswith(prefix) or value == f"{prefix}:memory:":
            return value
        return prefix + str(HOME / value.removeprefix(prefix))  # an absolute path stays as it is

    @field_validator("heartbeat_timeout")
    @classmethod
    def _timeout_above_interval(cls, value: float, info) -> float:
        interval = info.data.get("heartbeat_interval", 10.0)
        if value <= 2 * interval:
            raise ValueError(f"heartbeat_timeout ({value}) must exceed twice heartbeat_interval ({interval})")
        return value

    @field_validator("worker_heartbeat_timeout")
    @classmethod
    def _worker_timeout_above_interval(cls, value: float, info) -> float:
        interval = info.data.get("worker_heartbeat_interval", 15.0)
        if value <= 2 * interval:
            raise ValueError(
                f"worker_heartbeat_timeout ({value}) must exceed twice worker_heartbeat_interval ({interval})"
            )
        return value

    @field_validator("webhook_retry_schedule")
    @classmethod
    def _schedule_is_sane(cls, value: list[float]) -> list[float]:
        if not value:
            raise ValueError("webhook_retry_schedule needs at least one attempt")
        if any(delay < 0 for delay in value):
            raise ValueError("webhook_retry_schedule delays must be >= 0 seconds")
        return value

    @field_validator("webhook_allowed_networks")
    @classmethod
    def _networks_parse(cls, value: list[str]) -> list[str]:
        for network in value:
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError as exc:
                raise ValueError(f"webhook_allowed_networks: {network!r} is not an IP network ({exc})") from exc
        return value

    @field_validator("storage_url")
    @classmethod
    def _storage_url_scheme(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("s3://", "file:///")):
            raise ValueError(f"storage_url must be s3://bucket/prefix or file:///absolute/path, not {value!r}")
        return value

    @model_validator(mode="after")
    def _production_needs_servers(self) -> Settings:
        if self.environment == "production":
            if not self.database_url or self.database_url.startswith("sqlite"):
                raise ValueError("production needs DATABASE_URL pointing at PostgreSQL, not SQLite")
            if not self.broker_url or self.broker_url.startswith("filesystem"):
                raise ValueError("production needs BROKER_URL pointing at Redis, not the embedded broker")
        if self.job_time_limit <= self.job_soft_time_limit:
            raise ValueError("job_time_limit must exceed job_soft_time_limit")
        if self.environment == "production":
            metadata = [ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254")]
            for network in self.allowed_webhook_networks:
                if any(address in network for address in metadata):
                    raise ValueError(f"webhook_allowed_networks: {network} would expose the cloud metadata service")
        return self

    @property
    def json_logs(self) -> bool:
        return self.log_format == "json" or (self.log_format == "auto" and self.environment == "production")

    @property
    def allowed_webhook_networks(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        return [ipaddress.ip_network(network, strict=False) for network in self.webhook_allowed_networks]

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.var_dir / 'quant.db'}"

    @property
    def artifact_root(self) -> Path:
        return self.var_dir / "storage"

    @property
    def input_cache_dir(self) -> Path:
        return self.cache_dir if self.cache_dir is not None else self.var_dir / "cache"

    @property
    def broker_dir(self) -> Path:
        return self.var_dir / "broker"

    @property
    def visibility_timeout(self) -> int:
        """Redis redelivers an unacknowledged message after this; it must outlast any job."""
        return self.job_time_limit + 600


settings = Settings()
