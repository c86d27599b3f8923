"""Cancellation: a queued job ends at once; a running one within one progress step, leaving nothing.

The running job is canceled in its evaluate stage, when the exported model and its checkpoint already
sit in the job's work directory: the strictest case for "no partial artifacts".
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime

import pytest

from jobs import queries
from jobs.db import session_scope
from tests.conftest import Service
from tests.test_api import _wait_terminal
from tests.test_recovery import (  # slow_job_inputs is a fixture, shared with the crash tests
    EVALUATE_SLOW_RECIPE,
    _events,
    _start_and_wait_for_calibration,
    slow_job_inputs,  # noqa: F401
)

pytestmark = pytest.mark.e2e

# The cancel flag is read at most every 0.5 s inside a stage (worker.runner.CANCEL_CHECK_INTERVAL) and a
# batch here is one sample (milliseconds): the job should end within a second. 5 s leaves room for a
# loaded 2-core machine without letting a missed flag (the job running on to the end) pass.
CANCEL_BOUND_SECONDS = 5.0


def test_cancel_queued_and_running_jobs_leaves_nothing(service: Service, slow_job_inputs: dict) -> None:  # noqa: F811
    inputs = slow_job_inputs
    with service.client(inputs["key"]) as client:
        running = _start_and_wait_for_calibration(client, inputs, EVALUATE_SLOW_RECIPE, stage="evaluate")
        # One job process: a second job waits in the queue behind the first.
        queued = client.post("/jobs", json={"model_id": inputs["model_id"], "dataset_id": inputs["dataset_id"]}).json()[
            "id"
        ]
        assert client.get(f"/jobs/{queued}").json()["status"] == "queued"
        answer = client.post(f"/jobs/{queued}/cancel")
        assert answer.status_code == 202 and answer.json()["status"] == "canceled", answer.text

        work = service.var_dir / "storage" / ".work" / running
        assert (work / "model.qdq.onnx").is_file(), "the export should exist before the cancel"
        answer = client.post(f"/jobs/{running}/cancel")
        assert answer.json()["status"] in ("canceling", "canceled"), answer.text
        assert _wait_terminal(client, running, timeout=60) == "canceled"

        events = _events(client, running)
        asked = next(e for e in events if (e["data"] or {}).get("status") == "canceling")
        ended = next(e for e in events if (e["data"] or {}).get("status") == "canceled")
        took = datetime.fromisoformat(ended["created_at"]) - datetime.fromisoformat(asked["created_at"])
        took = took.total_seconds()
        assert took < CANCEL_BOUND_SECONDS, f"the cancel took {took:.1f} s"
        between = [e for e in events if asked["id"] < e["id"] < ended["id"] and e["kind"] == "progress"]
        assert len(between) <= 2, between  # progress events are 0.5 s apart: at most one flag read late

        for job_id in (queued, running):
            assert client.get(f"/jobs/{job_id}/artifacts").json() == []
            with session_scope(service.database_url) as session:
                assert list(queries.list_artifacts(session=session, job_id=uuid.UUID(job_id))) == []
            stored = [p for p in (service.var_dir / "storage").glob(f"*/jobs/{job_id}/**/*") if p.is_file()]
            assert stored == [], stored
        deadline = time.monotonic() + 10  # the work directory goes right after the terminal commit
        while work.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not work.exists(), sorted(p.name for p in work.iterdir())
