"""Where a job's TensorRT engine is built: here, on a GPU worker of the `engine` queue, or nowhere.

``EngineRouter`` is the ``engine_builder`` the runner gives ``quantcore.quantize``. At the engine stage:

1. this worker node is registered ``engine_capable`` (it has a GPU with TensorRT and consumes the
   `engine` queue): build here, in this pool process;
2. no live node is: the stage ends ``skipped`` at once, "no GPU worker with TensorRT is registered"
   (the static Q/DQ checks still run); the job goes on and succeeds with its QDQ model;
3. otherwise hand it off: write the inputs beside the QDQ model, open a hand-off
   (`jobs.workers.request_engine`), send `worker.build_engine` to the `engine` queue, and wait, polling
   the job row every ``POLL_SECONDS``, with progress events. The wait ends when the engine worker
   reports; when nobody has taken the build after ``engine_wait_seconds`` (``skipped``), when every
   capable worker is gone before one took it (``skipped``), when the worker that took it stops
   heart-beating (``failed``), or when the job is canceled (the stage raises ``Canceled`` at once and the
   engine worker's build stops at its next check).

Every outcome is recorded on the job: ``engine_status``, ``engine_reason``, ``engine_worker``,
``engine_gpu``, ``engine_tensorrt_version``.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from celery import current_task

from jobs import workers
from jobs.config import settings
from jobs.db import session_scope
from jobs.queue import enqueue_engine_build
from quantcore import atomic
from quantcore.errors import Canceled
from quantcore.progress import CancelCheck, ProgressCallback
from quantcore.tensorrt.engine import EngineResult, build_engine
from worker.engine_task import INPUTS_FILE, REQUEST_FILE, RESULT_FILE, timing_cache_dir

log = logging.getLogger(__name__)

STAGE = "engine"
POLL_SECONDS = 0.5  # how often the waiting job reads the hand-off state
NO_WORKER = "no GPU worker with TensorRT is registered"


def _relative(path: Path) -> str:
    """``path`` relative to the storage root, where both workers find it."""
    return str(Path(path).resolve().relative_to(settings.artifact_root))


class EngineRouter:
    """Build the job's engine where a GPU is (see the module docstring). ``owner`` is the runner's claim."""

    def __init__(self, job_id: uuid.UUID, owner: str, node: str | None = None) -> None:
        self.job_id, self.owner = job_id, owner
        request = getattr(current_task, "request", None)
        self.node = node or getattr(request, "hostname", None)  # this Celery node's name

    def __call__(
        self,
        qdq_model_path: str | Path,
        out_dir: str | Path,
        *,
        fp32_model_path: str | Path | None = None,
        evaluation: Mapping[str, np.ndarray] | None = None,
        calibration_shapes: Mapping[str, Sequence[Sequence[int]]] | None = None,
        progress: ProgressCallback | None = None,
        should_cancel: CancelCheck | None = None,
    ) -> EngineResult:
        build: dict[str, Any] = {
            "fp32_model_path": fp32_model_path,
            "evaluation": evaluation,
            "calibration_shapes": calibration_shapes,
            "progress": progress,
            "should_cancel": should_cancel,
        }
        timeout = settings.worker_heartbeat_timeout
        with session_scope(settings.resolved_database_url) as session:
            me = workers.get_worker(session=session, name=self.node, timeout=timeout) if self.node else None
            capable = [w.name for w in workers.engine_workers(session=session, timeout=timeout)]
        if me is not None and me.engine_capable:
            result = build_engine(qdq_model_path, out_dir, timing_cache_dir=timing_cache_dir(), **build)
            gpu = (result.metadata.get("gpu") or {}).get("name") or me.gpu_name
            version = result.metadata.get("tensorrt_version") or me.tensorrt_version
            self._record(result, worker=self.node, gpu=gpu, version=version)
            return result
        if not capable:
            return self._skip(qdq_model_path, out_dir, NO_WORKER, build)
        return self._hand_off(Path(qdq_model_path), Path(out_dir), capable, build)

    def _record(self, result: EngineResult, *, worker: str | None, gpu: str | None, version: str | None) -> None:
        with session_scope(settings.resolved_database_url) as session:
            workers.record_engine(
                session=session,
                job_id=self.job_id,
                status=result.status,
                reason=result.reason,
                worker=worker,
                gpu=gpu,
                tensorrt_version=version,
            )

    def _skip(
        self, qdq_model_path: str | Path, out_dir: str | Path, reason: str, build: dict[str, Any]
    ) -> EngineResult:
        result = build_engine(qdq_model_path, out_dir, skip_reason=reason, **build)
        self._record(result, worker=None, gpu=None, version=None)
        return result

    def _hand_off(self, qdq_path: Path, folder: Path, capable: list[str], build: dict[str, Any]) -> EngineResult:
        from worker.app import app  # the Celery app; imported here so quantcore-only callers need no broker

        folder.mkdir(parents=True, exist_ok=True)
        if build["evaluation"]:
            with (folder / INPUTS_FILE).open("wb") as handle:
                np.savez(handle, **build["evaluation"])
        fp32 = build["fp32_model_path"]
        spec = {
            "qdq_model": _relative(qdq_path),
            "fp32_model": None if fp32 is None else _relative(Path(fp32)),
            "calibration_shapes": build["calibration_shapes"],
        }
        atomic.write_json(folder / REQUEST_FILE, spec)
        with session_scope(settings.resolved_database_url) as session:
            request = workers.request_engine(session=session, job_id=self.job_id, owner=self.owner)
        if request is None:  # canceled (or taken from us) since the last check
            raise Canceled(STAGE)
        enqueue_engine_build(app, self.job_id, request, _relative(folder), expires=settings.engine_wait_seconds + 60)
        log.info("job %s: engine build %s handed off; %s can take it", self.job_id, request, ", ".join(capable))
        status, reason = self._wait(request, build["progress"], build["should_cancel"])
        written = folder / RESULT_FILE
        if reason is None and written.exists():  # the engine worker reported; its result file says the rest
            return EngineResult.from_dict(json.loads(written.read_text()))
        result = build_engine(qdq_path, folder, skip_reason=reason or f"the engine worker reported {status}", **build)
        return result if status == "skipped" else replace(result, status=status)

    def _wait(
        self, request: uuid.UUID, progress: ProgressCallback | None, should_cancel: CancelCheck | None
    ) -> tuple[str, str | None]:
        """Poll the hand-off until it ends: (status, None) when the engine worker reported, (status, reason)
        when the wait ended here. Raises ``Canceled`` when the job is canceled or taken by another attempt."""
        wait, timeout = settings.engine_wait_seconds, settings.worker_heartbeat_timeout
        started, last_message = time.monotonic(), ""
        while True:
            canceled = should_cancel is not None and should_cancel()
            with session_scope(settings.resolved_database_url) as session:
                state = workers.engine_state(session=session, job_id=self.job_id)
                alive = [w.name for w in workers.engine_workers(session=session, timeout=timeout)]
                builder = (
                    state and state.worker and workers.get_worker(session=session, name=state.worker, timeout=timeout)
                )
            if state is None or state.request != request:  # the job is gone or another attempt owns it
                raise Canceled(STAGE)
            if canceled or state.cancel_requested:
                self._end(request, "skipped", "the job was canceled while it waited for the engine build")
                raise Canceled(STAGE)
            if state.status in workers.ENGINE_ENDED:
                return state.status, None
            elapsed = time.monotonic() - started
            ending = None
            if state.status == "queued" and elapsed >= wait:
                registered = ", ".join(alive) or "none"
                ending = (
                    "skipped",
                    f"no GPU worker took the engine build within {wait:g} s (registered: {registered})",
                )
            elif state.status == "queued" and not alive:
                ending = ("skipped", f"{NO_WORKER} any more (the registered ones stopped before taking the build)")
            elif state.status == "running" and not builder:
                ending = ("failed", f"GPU worker {state.worker} stopped heart-beating during the engine build")
            if ending is not None and self._end(request, *ending):
                return ending
            if ending is None and progress is not None:
                if state.status == "queued":
                    message = f"waiting for a GPU worker to take the engine build ({elapsed:.0f} s of {wait:g} s)"
                    fraction = min(0.9, elapsed / wait) if wait else 0.0
                else:
                    message, fraction = f"building on {state.worker} ({elapsed:.0f} s)", 0.5
                if message != last_message:
                    progress(STAGE, fraction, message)
                    last_message = message
            time.sleep(POLL_SECONDS)

    def _end(self, request: uuid.UUID, status: str, reason: str) -> bool:
        """Stop waiting for hand-off `request`; False when the engine worker reported first."""
        with session_scope(settings.resolved_database_url) as session:
            return workers.end_engine(
                session=session, job_id=self.job_id, request=request, status=status, reason=reason
            )
