"""The `engine`-queue task: build one job's TensorRT engine on this GPU worker and report back.

    job id + request id + hand-off directory
      ─▶ claim the hand-off (only while the request is current and the job not canceled)
      ─▶ quantcore.build_engine on the QDQ model the job exported
      ─▶ result.json (+ model.engine, engine.json when built), written atomically
      ─▶ finish the hand-off with the status, the GPU and the TensorRT version

The hand-off directory lies under the storage root, which the job's worker and this one share (one
volume in docker-compose; a shared filesystem across machines). Files in it, written by
`worker.engine_routing` before the task is sent: ``request.json`` (model paths relative to the storage
root, the calibration shapes profiles are derived from) and ``inputs.npz`` (evaluation inputs, for the
engine-vs-ONNX Runtime comparison and latency). The job's runner keeps the job's stage, progress and
terminal state; this task writes only the ``engine_*`` columns and `log` events.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from jobs import queries, storage, workers
from jobs.config import settings
from jobs.db import session_scope
from quantcore import atomic
from quantcore.errors import Canceled
from quantcore.tensorrt.engine import EngineResult, build_engine

log = logging.getLogger(__name__)

REQUEST_FILE = "request.json"
INPUTS_FILE = "inputs.npz"
RESULT_FILE = "result.json"
CANCEL_CHECK_INTERVAL = 1.0  # seconds between reads of the hand-off state during a build


def timing_cache_dir() -> Path:
    """One TensorRT timing cache per (GPU model, TensorRT version) lives here, shared by all jobs."""
    return settings.var_dir.resolve() / "tensorrt-cache"


class _StillWanted:
    """``should_cancel`` for the build: True once the job is canceled or its runner stopped waiting.
    TensorRT calls it from its own threads, so it opens a fresh session per read, under a lock."""

    def __init__(self, job_id: uuid.UUID, request: uuid.UUID) -> None:
        self.job_id, self.request = job_id, request
        self.lock = threading.Lock()
        self.checked_at = -CANCEL_CHECK_INTERVAL
        self.cancel = False

    def __call__(self) -> bool:
        with self.lock:
            now = time.monotonic()
            if not self.cancel and now - self.checked_at >= CANCEL_CHECK_INTERVAL:
                self.checked_at = now
                with session_scope(settings.resolved_database_url) as session:
                    state = workers.engine_state(session=session, job_id=self.job_id)
                self.cancel = (
                    state is None
                    or state.cancel_requested
                    or state.request != self.request
                    or state.status != "running"
                )
            return self.cancel


def build_for_job(job_id: uuid.UUID, request: uuid.UUID, directory: str, node: str) -> None:
    """Run hand-off `request` of job `job_id` on worker node `node`; do nothing when it is not current."""
    url = settings.resolved_database_url
    with session_scope(url) as session:
        me = workers.get_worker(session=session, name=node, timeout=settings.worker_heartbeat_timeout)
        if me is None or not me.engine_capable:  # it stopped consuming the queue; this message came first
            log.error("worker %s is not registered as able to build engines; leaving job %s's build", node, job_id)
            return
        gpu_name, version = me.gpu_name, me.tensorrt_version
        claimed = workers.claim_engine(
            session=session, job_id=job_id, request=request, worker=node, gpu=gpu_name, tensorrt_version=version
        )
        if claimed:
            queries.add_event(
                session=session,
                job_id=job_id,
                kind="log",
                stage="engine",
                message=f"engine build taken by {node} (GPU {gpu_name or 'unknown'}, TensorRT {version or 'unknown'})",
                data={"worker": node, "gpu": gpu_name, "tensorrt_version": version},
            )
    if not claimed:
        log.info("engine hand-off %s of job %s is no longer current; dropping it", request, job_id)
        return

    folder = storage.resolve(settings.artifact_root, directory)
    try:
        result = _build(folder, _StillWanted(job_id, request))
    except Canceled:
        log.info("engine build of job %s stopped: the job no longer waits for it", job_id)
        return
    try:
        atomic.write_json(folder / RESULT_FILE, result.to_dict())
    except FileNotFoundError:  # the job ended meanwhile and its worker removed the hand-off directory
        log.info("job %s stopped waiting for its engine build; the result is dropped", job_id)
        return
    gpu = result.metadata.get("gpu") or {}
    with session_scope(url) as session:
        reported = workers.finish_engine(
            session=session,
            job_id=job_id,
            request=request,
            status=result.status,
            reason=result.reason,
            gpu=gpu.get("name"),
            tensorrt_version=result.metadata.get("tensorrt_version"),
        )
    if not reported:
        log.info("job %s stopped waiting before its engine build ended", job_id)


def _build(folder: Path, should_cancel: _StillWanted) -> EngineResult:
    spec: dict[str, Any] = json.loads((folder / REQUEST_FILE).read_text())
    evaluation = None
    if (folder / INPUTS_FILE).exists():
        with np.load(folder / INPUTS_FILE, allow_pickle=False) as arrays:
            evaluation = {name: arrays[name] for name in arrays.files}
    fp32 = spec.get("fp32_model")
    try:
        return build_engine(
            storage.resolve(settings.artifact_root, spec["qdq_model"]),
            folder,
            fp32_model_path=None if fp32 is None else storage.resolve(settings.artifact_root, fp32),
            evaluation=evaluation,
            calibration_shapes=spec.get("calibration_shapes"),
            timing_cache_dir=timing_cache_dir(),
            should_cancel=should_cancel,
        )
    except Canceled:
        raise
    except Exception as exc:  # anything else ends the stage `failed` with the reason, never the job
        log.exception("engine build in %s crashed", folder)
        return EngineResult(status="failed", reason=f"internal error: {type(exc).__name__}: {exc}")
