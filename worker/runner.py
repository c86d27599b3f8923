"""Run one job: claim the row, heartbeat, run quantcore's stages, store artifacts, end the job.

    claim ─▶ load data ─▶ quantcore.quantize (prepare, annotate, calibrate, export, evaluate, analyze, ...),
                          or for strategy auto quantcore.auto.quantize_auto (the search, then the same)
          ─▶ store artifacts (temp name, rename) ─▶ succeeded | failed | canceled

A job whose accuracy target was not met fails with the engine's verdict as its error, and keeps its
artifacts (the best model found and the report saying why).

A redelivered duplicate finds the job claimed by a live worker and does nothing. A job whose
worker died is claimable again (same host: the owner pid is gone; elsewhere: the heartbeat is
stale), and the reaper requeues it; the retry works in the same per-job directory and resumes from
quantcore's checkpoint (calibrate and export are not redone). Database writes ride out an outage
(`jobs.db.in_transaction`). Cancellation, and a SIGTERM to the process (`worker.job_signals`), are checked
between stages and inside every batch loop, through quantcore's `should_cancel`.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import socket
import threading
import time
import uuid
from functools import partial
from pathlib import Path

from celery.exceptions import SoftTimeLimitExceeded

from jobs import queries, storage
from jobs.archives import archive_limits
from jobs.config import settings
from jobs.db import in_transaction, session_scope
from jobs.logs import job_context, log_context
from jobs.models import DatasetKind, JobStatus
from jobs.recipe import Recipe
from quantcore import QuantizeResult, atomic, quantize, quantize_auto
from quantcore.errors import Canceled, QuantcoreError
from quantcore.report.html import HTML_FILE
from quantcore.runtime.batching import input_specs
from worker.engine_routing import EngineRouter
from worker.inputs import JobInputs, StoredInput
from worker.job_signals import stop_if_requested
from worker.splits import Split, split_dataset, split_images
from worker.translate import parse_recipe, to_quantize_config

log = logging.getLogger(__name__)

# Share of the overall progress bar each stage takes (measured on the digits CNN, rounded).
STAGE_WEIGHTS = {
    "load": 0.03,
    "prepare": 0.04,
    "annotate": 0.02,
    "calibrate": 0.19,
    "clip": 0.04,
    "reconstruct": 0.09,
    "mixed_precision": 0.02,  # its ranking and steps, when asked for (skipped at once otherwise)
    "qat": 0.02,  # training, when asked for (skipped at once otherwise)
    "export": 0.04,
    "place": 0.02,  # latency placement, on the onnxruntime platform
    "evaluate": 0.20,
    "analyze": 0.08,
    "target": 0.05,
    "latency": 0.06,
    "engine": 0.05,
    "cpu_alternative": 0.01,  # the onnxruntime platform measured beside a model no engine was built for
    "store": 0.04,
}
AUTO_SHARE = 0.5  # of the bar, for a strategy auto job: the search runs each candidate through the stages


def stage_weights(strategy: str) -> dict[str, float]:
    """STAGE_WEIGHTS for a job of ``strategy``; for ``auto``, the search (stage ``auto``, after load) takes
    AUTO_SHARE of the bar and the final run's stages the rest, each scaled alike."""
    if strategy != "auto":
        return STAGE_WEIGHTS
    load = STAGE_WEIGHTS["load"]
    scale = (1.0 - load - AUTO_SHARE) / (1.0 - load)
    rest = {name: weight * scale for name, weight in STAGE_WEIGHTS.items() if name != "load"}
    return {"load": load, "auto": AUTO_SHARE, **rest}


ARTIFACTS = {
    "model.qdq.onnx": "application/octet-stream",
    "model.qdq.onnx.data": "application/octet-stream",  # its weights, beside it, for a model beyond 2 GB
    "tqc.json": "application/json",
    "report.json": "application/json",
    "report.html": "text/html",  # the report as a standalone page (quantcore.report.html)
    "model.engine": "application/octet-stream",  # TensorRT plan, on GPU workers only
    "engine.json": "application/json",
}
EVENT_MIN_INTERVAL = 0.5  # seconds between progress events inside a stage
CANCEL_CHECK_INTERVAL = 0.5  # seconds between reads of the cancel flag


class Abandoned(Exception):
    """The job is no longer ours (reaped after a stall, or finished elsewhere): stop quietly."""


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _owner_is_dead(claimed_by: str | None) -> bool:
    """True when the job's owner ran on this host and its process is gone (or it is us)."""
    if not claimed_by or ":" not in claimed_by:
        return False
    host, _, pid = claimed_by.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class Progress:
    """Turns quantcore's (stage, fraction) callbacks into job progress, events and cancel checks."""

    def __init__(self, job_id: uuid.UUID, owner: str, attempt: int) -> None:
        self.job_id = job_id
        self.owner = owner
        # Events are numbered within the attempt, the number taken before the transaction, so that a
        # retried transaction writes the same event again and the database keeps one.
        self.attempt = attempt
        self.sequence = itertools.count()
        self.url = settings.resolved_database_url
        self.stage: str | None = None
        self.last_event = 0.0
        self.last_cancel_check = -CANCEL_CHECK_INTERVAL
        self.canceled = False
        self.lost = threading.Event()
        self.weigh(STAGE_WEIGHTS)

    def weigh(self, weights: dict[str, float]) -> None:
        """Share the bar among the stages by ``weights`` (stage → share, in stage order, summing to 1)."""
        self.weights = weights
        self.starts = {}
        total = 0.0
        for name, weight in weights.items():
            self.starts[name] = total
            total += weight

    def overall(self, stage: str, fraction: float) -> float:
        return min(1.0, self.starts.get(stage, 0.0) + self.weights.get(stage, 0.0) * max(0.0, min(1.0, fraction)))

    def __call__(self, stage: str, fraction: float, message: str = "") -> None:
        now = time.monotonic()
        new_stage = stage != self.stage
        if new_stage or fraction >= 1.0:  # stage boundaries always read the cancel flag afresh
            self.last_cancel_check = -CANCEL_CHECK_INTERVAL
        if not new_stage and now - self.last_event < EVENT_MIN_INTERVAL and fraction < 1.0:
            return
        self.stage = stage
        self.last_event = now
        sequence = next(self.sequence)
        in_transaction(
            self.url,
            lambda session: queries.set_progress(
                session=session,
                job_id=self.job_id,
                worker_id=self.owner,
                stage=stage,
                progress=self.overall(stage, fraction),
                message=message or f"{stage} {fraction:.0%}",
                kind="stage" if new_stage else "progress",
                attempt=self.attempt,
                sequence=sequence,
            ),
            budget=settings.db_retry_seconds,
        )

    def log(self, message: str, **data: object) -> None:
        """A `log` event: something the user should read (a warning from the engine, say)."""
        sequence = next(self.sequence)
        in_transaction(
            self.url,
            lambda session: queries.add_event(
                session=session,
                job_id=self.job_id,
                kind="log",
                stage=self.stage,
                message=message,
                data=data or None,
                attempt=self.attempt,
                sequence=sequence,
            ),
            budget=settings.db_retry_seconds,
        )

    def should_cancel(self) -> bool:
        """quantcore calls this once per batch: inside a stage, read the flag from the DB at most every
        CANCEL_CHECK_INTERVAL seconds rather than once per batch; at every stage boundary, read it
        afresh (``__call__`` resets the clock), so a request is never missed by a short stage."""
        stop_if_requested()  # SIGTERM or the soft time limit (worker.job_signals)
        if self.lost.is_set():
            raise Abandoned(f"job {self.job_id} was taken from this worker")
        now = time.monotonic()
        if now - self.last_cancel_check >= CANCEL_CHECK_INTERVAL:
            self.last_cancel_check = now
            self.canceled = in_transaction(
                self.url,
                lambda session: queries.cancel_requested(session=session, job_id=self.job_id),
                budget=settings.db_retry_seconds,
            )
        return self.canceled


class Heartbeat(threading.Thread):
    def __init__(self, progress: Progress) -> None:
        super().__init__(daemon=True, name=f"heartbeat-{progress.job_id}")
        self.progress = progress
        self.stopped = threading.Event()

    def _beat(self) -> None:
        while not self.stopped.wait(settings.heartbeat_interval):
            try:
                with session_scope(self.progress.url) as session:
                    ours = queries.heartbeat(
                        session=session, job_id=self.progress.job_id, worker_id=self.progress.owner
                    )
            except Exception:  # a DB blip: try again next beat; the timeout is several beats long
                log.warning("heartbeat for job %s failed", self.progress.job_id, exc_info=True)
                continue
            if not ours:
                self.progress.lost.set()
                return

    def run(self) -> None:
        with log_context(job_id=str(self.progress.job_id)):  # a thread starts with an empty context
            self._beat()


@job_context
def run_job(job_id: uuid.UUID) -> None:
    owner = worker_id()
    url = settings.resolved_database_url
    with session_scope(url) as session:
        current = queries.get_job_unscoped(session=session, job_id=job_id)
        if current is None or current.status not in (JobStatus.queued, JobStatus.running):
            log.info("job %s is %s; nothing to do", job_id, current and current.status)
            return
        job = queries.claim_job(
            session=session,
            job_id=job_id,
            worker_id=owner,
            heartbeat_timeout=settings.heartbeat_timeout,
            max_attempts=settings.max_attempts,
            dead_owner=_owner_is_dead(current.claimed_by),
        )
        if job is None:
            log.info("job %s is held by a live worker (%s); dropping duplicate delivery", job_id, current.claimed_by)
            return
        inputs = JobInputs(
            storage.open_store(settings),
            settings.input_cache_dir,
            settings.cache_max_bytes,
            StoredInput("model", job.model.path, job.model.sha256),
            StoredInput("dataset", job.dataset.path, job.dataset.sha256),
        )
        dataset_kind = job.dataset.kind
        recipe_data, project_id, attempt = job.recipe, job.project_id, job.attempts
        log.info("job started (attempt %d) on %s", attempt, owner)

    progress = Progress(job_id, owner, attempt)
    heartbeat = Heartbeat(progress)
    heartbeat.start()
    # One work directory per job, kept across attempts: a retry resumes from its checkpoint. It is
    # removed once the job ends, never by an attempt that lost the job (the new owner is using it).
    work_dir = settings.artifact_root / ".work" / str(job_id)
    try:
        with inputs:  # the cached inputs stay pinned (safe from eviction) while the job reads them
            status, error, stored = _execute(progress, inputs, dataset_kind, recipe_data, work_dir, project_id)
    except Abandoned as exc:
        log.warning("%s", exc)
        return
    finally:
        heartbeat.stopped.set()
    store = storage.open_store(settings)
    if status != JobStatus.succeeded and not stored:  # a canceled or failed job leaves no partial artifacts
        store.delete_prefix(storage.job_dir(project_id, job_id) + "/")

    def finish(session) -> bool:
        # Artifact rows and the terminal state commit together: a reader never sees one without the other.
        # The staged artifacts move to their keys just before (a retried move is a no-op); a crash
        # between the two leaves objects no row names, which the sweep removes (`worker.sweep`).
        for artifact in stored:
            store.move(storage.staging_key(project_id, job_id, attempt, artifact["name"]), artifact["path"])
            queries.add_artifact(session=session, job_id=job_id, **artifact)
        if queries.finish_job(session=session, job_id=job_id, worker_id=owner, status=status, error=error):
            return True
        session.rollback()
        return False

    if in_transaction(url, finish, budget=settings.db_retry_seconds):
        shutil.rmtree(work_dir, ignore_errors=True)
        store.delete_prefix(f"{storage.job_dir(project_id, job_id)}/{storage.STAGING}/")
        log.info("job ended %s%s", status.value, f": {error}" if error else "")
    else:
        log.warning("job %s was no longer ours to finish", job_id)


def _execute(
    progress: Progress,
    inputs: JobInputs,
    dataset_kind: DatasetKind,
    recipe_data: dict,
    work_dir: Path,
    project_id: uuid.UUID,
) -> tuple[JobStatus, str | None, list[dict]]:
    try:
        recipe = parse_recipe(recipe_data)
        progress.weigh(stage_weights(recipe.strategy))
        progress("load", 0.0, "reading the dataset")
        model_path, dataset_path = inputs.fetch(progress.log)
        split = _load_split(progress, model_path, dataset_path, dataset_kind, recipe)
        progress(
            "load",
            1.0,
            f"{len(split.calibration_indices)} calibration, {len(split.evaluation_indices)} evaluation samples",
        )

        should_cancel = progress.should_cancel
        if should_cancel():
            raise Canceled("canceled")
        work_dir.mkdir(parents=True, exist_ok=True)
        config = to_quantize_config(recipe, timing_cache=settings.var_dir / "cpu-timings")  # shared by the workers
        # the automatic search re-splits the calibration samples, and the recipe refuses a label loss with it
        labelled = partial(quantize, calibration_labels=split.calibration_labels)
        run = quantize_auto if config.strategy == "auto" else labelled
        result = run(
            model_path,
            split.calibration,
            split.evaluation,
            config,
            work_dir,
            labels=split.labels,
            progress=progress,
            should_cancel=should_cancel,
            engine_builder=EngineRouter(progress.job_id, progress.owner),  # here, on a GPU worker, or skipped
            resume_from=work_dir,
        )
        if result.report.get("auto") is not None:
            progress.log(f"auto: {result.report['auto']['reason']}")
        if result.report.get("resumed"):
            progress.log(f"reused from an earlier attempt: {', '.join(result.report['resumed'])}")
        for warning in result.report.get("warnings", []):
            progress.log(str(warning))
        _record_split(result.report_path, split.record)
        progress("store", 0.0, "storing artifacts")
        stored = _store(progress, project_id, result)
        if should_cancel():
            raise Canceled("canceled")
        target = result.report.get("target")
        if target is not None and not target["met"]:  # fails, but the best model found stays downloadable
            return JobStatus.failed, target["verdict"], stored
        return JobStatus.succeeded, None, stored
    except Canceled:
        return JobStatus.canceled, "canceled by request", []
    except SoftTimeLimitExceeded:
        limit = settings.job_soft_time_limit
        return JobStatus.failed, f"time limit of {limit} s exceeded during {progress.stage}", []
    except QuantcoreError as exc:
        return JobStatus.failed, f"{progress.stage}: {exc}", []
    except Abandoned:
        raise
    except Exception as exc:
        log.exception("job %s crashed", progress.job_id)
        return JobStatus.failed, f"internal error during {progress.stage}: {type(exc).__name__}: {exc}", []


def _load_split(progress: Progress, model_path: Path, path: Path, kind: DatasetKind, recipe: Recipe) -> Split:
    """The seeded split, with samples along each model input's batch axis as quantcore batches them."""
    specs = input_specs(model_path)
    if kind == DatasetKind.arrays:
        return split_dataset(path, {spec.name: spec.batch_axis for spec in specs}, recipe)

    def should_stop() -> None:
        if progress.should_cancel():
            raise Canceled("canceled while decoding images")

    return split_images(
        path,
        [spec.name for spec in specs],
        recipe,
        limits=archive_limits(settings),
        max_pixels=settings.max_image_pixels,
        should_stop=should_stop,
    )


def _record_split(report_path: str | Path, record: dict) -> None:
    """Add the seeded split (counts, SHA-256 of the chosen samples, label source) to report.json."""
    path = Path(report_path)
    report = json.loads(path.read_text())
    report["dataset"] = record
    atomic.write_json(path, report)


def _store(progress: Progress, project_id: uuid.UUID, result: QuantizeResult) -> list[dict]:
    """Copy each artifact to its staging key in the store (`storage.staging_key`); `run_job` moves them
    to their keys, `path` in each returned row, when it commits the job's end."""
    directory = storage.job_dir(project_id, progress.job_id)
    store = storage.open_store(settings)
    files = {
        "model.qdq.onnx": result.model_path,
        "tqc.json": result.tqc_path,
        "report.json": result.report_path,
        "report.html": result.report_path.with_name(HTML_FILE),
    }
    if result.model_data_path is not None:
        files["model.qdq.onnx.data"] = result.model_data_path
    if result.engine_path is not None:
        files["model.engine"] = result.engine_path
        files["engine.json"] = result.engine_metadata_path
    stored = []
    for name, source in files.items():
        relative = f"{directory}/{name}"
        staged = storage.staging_key(project_id, progress.job_id, progress.attempt, name)
        size, digest = store.put_file(Path(source), staged)
        stored.append(
            {"name": name, "media_type": ARTIFACTS[name], "path": relative, "size_bytes": size, "sha256": digest}
        )
    progress("store", 1.0, f"stored {len(stored)} artifacts")
    return stored
