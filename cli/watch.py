"""Follow a job's events: a progress bar (overall progress 0 to 1, stage in the description) with log
lines printed above it, until the terminal status event.

Event payloads are `{id, kind, stage, progress, message, data, created_at}`; `kind` is one of
status | stage | progress | log, and a status event carries the job status in `data.status`.
When the bar is off (`--no-progress`, or stderr is not a terminal) stage changes are printed as
lines instead, so a CI log still shows where the job is.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from tqdm import tqdm

from cli.client import Client, job_path
from cli.sse import Event, EventStream, StreamLost

TERMINAL_STATUSES = frozenset({"succeeded", "failed", "canceled"})


def progress_bar(*, total: float, desc: str, enabled: bool | None, unit: str = "it", **kwargs: Any) -> tqdm:
    """A tqdm bar on stderr; `enabled=None` means "only when stderr is a terminal"."""
    return tqdm(
        total=total,
        desc=desc,
        file=sys.stderr,
        disable=None if enabled is None else not enabled,
        unit=unit,
        dynamic_ncols=True,
        leave=True,
        **kwargs,
    )


class JobWatcher:
    """Draws one job's events; `run()` returns the job as read after its terminal status."""

    def __init__(
        self, client: Client, job_id: str, *, progress: bool | None = None, out: TextIO | None = None, **stream_kw: Any
    ) -> None:
        self.client = client
        self.job_id = job_id
        self.progress = progress
        self.out = out or sys.stderr
        # Two empty connections in a row are enough to ask the job itself (see `run`).
        stream_kw.setdefault("max_failures", 2)
        self.stream = EventStream(client, job_path(job_id, "events"), **stream_kw)
        self.stage: str | None = None
        self.status: str | None = None
        self.bar: tqdm | None = None

    def run(self) -> dict[str, Any]:
        job = self.client.get_json(job_path(self.job_id))
        self.status = job.get("status")
        self.bar = progress_bar(
            total=1.0,
            desc=job.get("stage") or self.status or "",
            enabled=self.progress,
            bar_format="{desc} {percentage:3.0f}%|{bar}| [{elapsed}]",
        )
        try:
            self._set_progress(job.get("progress"))
            while True:
                try:
                    for event in self.stream:
                        if self._handle(event):
                            return self._final()
                except StreamLost:
                    # The server keeps closing without news: it may have pruned events of a finished job,
                    # or the job is in a long silent stage. Ask the job itself.
                    job = self.client.get_json(job_path(self.job_id))
                    if job.get("status") in TERMINAL_STATUSES:
                        self.status = job["status"]
                        return self._final(job)
        finally:
            self.bar.close()

    def _handle(self, event: Event) -> bool:
        """Apply one event; True when it is the terminal status event."""
        payload = event.json()
        kind = payload.get("kind") or event.event
        self._set_progress(payload.get("progress"))
        stage = payload.get("stage")
        if stage and stage != self.stage:
            self.stage = stage
            self.bar.set_description_str(stage)
            if self.bar.disable:
                self._write(f"stage: {stage}")
        if kind == "log":
            prefix = f"[{stage}] " if stage else ""
            self._write(f"{_clock(payload.get('created_at'))}{prefix}{payload.get('message', '')}")
        elif kind == "status":
            data = payload.get("data") if isinstance(payload.get("data"), dict) else {}
            status = data.get("status")
            if status:
                self.status = status
                if self.bar.disable or status not in TERMINAL_STATUSES:
                    self._write(f"status: {_status_text(status, payload.get('message'))}")
            return status in TERMINAL_STATUSES
        return False

    def _final(self, job: dict[str, Any] | None = None) -> dict[str, Any]:
        job = job or self.client.get_json(job_path(self.job_id))
        # The row and the stream agree once the stream ended; prefer the stream's word on the status.
        job = {**job, "status": self.status or job.get("status")}
        if job["status"] == "succeeded":
            self._set_progress(1.0)
        return job

    def _set_progress(self, value: Any) -> None:
        if isinstance(value, int | float) and not isinstance(value, bool):
            self.bar.n = min(max(float(value), 0.0), 1.0)
            self.bar.refresh()

    def _write(self, line: str) -> None:
        self.bar.write(line, file=self.out)


def _status_text(status: str, message: Any) -> str:
    """`running` + `running (attempt 2) on host` → the message alone; else `status (message)`."""
    if not isinstance(message, str) or not message:
        return status
    return message if message.startswith(status) else f"{status} ({message})"


def _clock(created_at: Any) -> str:
    """`2025-01-02T03:04:05.123+00:00` → `03:04:05 ` (empty when absent or unparseable)."""
    if isinstance(created_at, str) and "T" in created_at:
        return created_at.split("T", 1)[1][:8] + " "
    return ""
