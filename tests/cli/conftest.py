"""A small fake of the service's HTTP API, served by uvicorn on 127.0.0.1 in a thread.

It answers with canned but structurally correct bodies and records what the client sent (cursors,
Last-Event-ID, Range headers, uploaded bytes), so the tests check the client's side of the
contract: problem+json rendering, cursor pagination, SSE resume, resumable downloads. The real
service is tested end to end elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

API_KEY = "test-key"
CREATED = "2025-01-02T03:04:05.000000+00:00"
MODEL_BYTES = bytes(range(256)) * 40  # 10 KiB stand-in for an ONNX file; the fake never parses it
ARTIFACTS = {
    "model.qdq.onnx": bytes((i * 7) % 251 for i in range(300_000)),  # ~293 KiB, several download chunks
    "tqc.json": b'{"conv1_out": {"scale": 0.02, "offset": 0}}',
}
# The shape quantcore wrote when this was written (`quantcore.report/1`), trimmed.
REPORT = {
    "format": "quantcore.report/1",
    "config": {"platform": "tensorrt", "precision": "int8", "observer": "minmax", "batch_size": 16},
    "evaluation": {
        "model": {"fp32_bytes": 4_000_000, "qdq_bytes": 1_100_000},
        "num_samples": 359,
        "top1_output": "logits",
        "fp32": {"top1": 0.76},
        "qdq_exact": {
            "top1": 0.755,
            "outputs": {"logits": {"sqnr_db": 31.2, "cosine": 0.9996, "argmax_agreement": 0.99}},
        },
        "qdq_deployed": {
            "top1": 0.75,
            "outputs": {"logits": {"sqnr_db": 29.8, "cosine": 0.9993, "argmax_agreement": 0.98}},
            "kernels": {"QLinearConv": 3},
        },
    },
    "parity": {"agree": True, "reason": "the deployed model (3 integer kernels) agrees with exact Q/DQ"},
    "analysis": {
        "layers": [
            {"rank": 1, "node": "fc", "op_type": "Gemm", "sqnr_db": 22.5, "cosine": 0.998, "analyzed": True},
            {"rank": 2, "node": "conv1", "op_type": "Conv", "sqnr_db": 40.1, "cosine": 0.9999, "analyzed": True},
        ]
    },
    "stage_seconds": {"calibrate": 0.05, "export": 0.01},
    "engine": {"status": "skipped", "reason": "no CUDA device"},
    "warnings": ["block /layer4 left at round-to-nearest"],
}


def problem(status: int, title: str, detail: str | None = None, **extra: Any) -> JSONResponse:
    body = {"type": "about:blank", "title": title, "status": status, **extra}
    if detail:
        body["detail"] = detail
    return JSONResponse(body, status_code=status, media_type="application/problem+json")


def job_body(job_id: str, status: str = "queued", **extra: Any) -> dict[str, Any]:
    return {
        "id": job_id,
        "model_id": "m-1",
        "dataset_id": "d-1",
        "recipe": {},
        "status": status,
        "stage": None,
        "progress": 0.0,
        "error": None,
        "attempts": 0,
        "created_at": CREATED,
        "started_at": None,
        "finished_at": None,
        "updated_at": CREATED,
        **extra,
    }


def scripted_events(final: str = "succeeded", message: str = "") -> list[dict[str, Any]]:
    """The events of one job: running, two stages with progress and logs, then `final`."""
    rows: list[tuple[str, str | None, float | None, str, dict[str, Any] | None]] = [
        ("status", None, 0.0, "running (attempt 1) on fake:1", {"status": "running"}),
        ("stage", "calibrate", 0.1, "", None),
        ("log", "calibrate", None, "observing 12 tensors", None),
        ("progress", "calibrate", 0.4, "", None),
        ("stage", "export", 0.7, "", None),
        ("log", "export", None, "inserted 24 QuantizeLinear nodes", None),
        ("progress", "export", 0.9, "", None),
        ("status", "export", 1.0 if final == "succeeded" else None, message, {"status": final}),
    ]
    return [
        {
            "id": i,
            "kind": kind,
            "stage": stage,
            "progress": progress,
            "message": msg,
            "data": data,
            "created_at": CREATED,
        }
        for i, (kind, stage, progress, msg, data) in enumerate(rows, start=1)
    ]


@dataclass
class FakeApi:
    """The fake's data and a log of what the client sent; tests adjust it before calling the CLI."""

    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    # SHA-256 -> a ready model's or dataset's body: the same bytes uploaded again are answered with it (200).
    held: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # job id -> (events sent before the first connection is cut, "raise" = reset mid-body | "close" = clean end)
    drops: dict[str, tuple[int, str]] = field(default_factory=dict)
    pending_polls: int = 1  # GETs of a fresh model that still answer "pending"
    ignore_range: bool = False
    # Logs.
    uploads: list[dict[str, Any]] = field(default_factory=list)
    job_posts: list[dict[str, Any]] = field(default_factory=list)
    list_queries: list[dict[str, str]] = field(default_factory=list)
    event_connections: list[tuple[str, str | None]] = field(default_factory=list)
    ranges: list[str | None] = field(default_factory=list)
    url: str = ""

    # Shared constants, reachable from the tests through the fixture (tests import nothing from here).
    api_key: str = API_KEY
    model_bytes: bytes = MODEL_BYTES
    artifacts: dict[str, bytes] = field(default_factory=lambda: ARTIFACTS)
    report: dict[str, Any] = field(default_factory=lambda: REPORT)

    def add_job(self, job_id: str, status: str = "queued", *, events: str | None = None, **extra: Any) -> None:
        """A job row; with `events`, also its scripted event stream ending in that status."""
        self.jobs[job_id] = job_body(job_id, status, **extra)
        if events:
            self.events[job_id] = scripted_events(events, message=extra.get("error") or "")

    def seed_jobs(self, count: int) -> None:
        for i in range(count):
            self.add_job(f"job-{i:02d}", "succeeded" if i % 2 else "failed")


def build_app(state: FakeApi) -> Starlette:
    def authorized(request: Request) -> bool:
        return request.headers.get("x-api-key") == API_KEY

    async def upload(request: Request) -> Response:
        if not authorized(request):
            return problem(401, "Unauthorized", "missing or unknown API key")
        async with request.form() as form:  # closes the spooled upload file
            file = form["file"]
            data = await file.read()
        record = {
            "collection": request.url.path.rsplit("/", 1)[-1],
            "filename": file.filename,
            "sha256": hashlib.sha256(data).hexdigest(),
            "size": len(data),
            "content_length": request.headers.get("content-length"),
            "data": data,
        }
        state.uploads.append(record)
        if record["sha256"] in state.held and request.query_params.get("reuse") != "false":
            return JSONResponse(_public(state.held[record["sha256"]]), 200)
        item_id = f"{record['collection'][0]}-{len(state.uploads)}"
        common = {"id": item_id, "filename": file.filename, "sha256": record["sha256"], "size_bytes": len(data)}
        if record["collection"] == "datasets":
            arrays = [{"name": "input", "dtype": "float32", "shape": [8, 3, 4, 4]}]
            state.held[record["sha256"]] = {**common, "arrays": arrays, "num_samples": 8, "created_at": CREATED}
            return JSONResponse(state.held[record["sha256"]], 201)
        if "bad" in (file.filename or ""):
            state.models[item_id] = {**common, "status": "invalid", "error": "not an ONNX protobuf", "info": None}
            return JSONResponse(state.models[item_id], 201)
        state.models[item_id] = {**common, "status": "pending", "error": None, "info": None, "created_at": CREATED}
        state.models[item_id]["_polls"] = 0
        return JSONResponse(_public(state.models[item_id]), 202)

    async def show_model(request: Request) -> Response:
        model = state.models.get(request.path_params["id"])
        if model is None:
            return problem(404, "Not Found", "no such model")
        model["_polls"] = model.get("_polls", 0) + 1
        if model["status"] == "pending" and model["_polls"] > state.pending_polls:
            model["status"] = "ready"
            model["info"] = {"opset": 17, "inputs": [{"name": "input", "shape": ["N", 3, 4, 4]}]}
            state.held[model["sha256"]] = model
        return JSONResponse(_public(model))

    async def list_collection(request: Request) -> Response:
        if not authorized(request):
            return problem(401, "Unauthorized", "missing or unknown API key")
        query = dict(request.query_params)
        state.list_queries.append(query)
        source = state.jobs if request.url.path.endswith("/jobs") else state.models
        items = [_public(item) for item in source.values() if item.get("status") == query.get("status", item["status"])]
        start = int(query.get("cursor") or 0)
        limit = int(query.get("limit") or 50)
        page = items[start : start + limit]
        next_cursor = str(start + limit) if start + limit < len(items) else None
        return JSONResponse({"items": page, "next_cursor": next_cursor})

    async def show_dataset(request: Request) -> Response:
        return problem(404, "Not Found", f"dataset {request.path_params['id']} does not exist")

    async def submit(request: Request) -> Response:
        body = await request.json()
        state.job_posts.append(body)
        observer = body.get("recipe", {}).get("calibration", {}).get("observer", "percentile")
        if observer not in ("minmax", "percentile"):
            return problem(
                422,
                "Validation failed",
                "the request body is invalid",
                errors=[
                    {"field": "recipe.calibration.observer", "message": "Input should be 'minmax' or 'percentile'"}
                ],
            )
        job_id = f"job-new-{len(state.job_posts)}"
        state.jobs[job_id] = job_body(job_id, model_id=body["model_id"], recipe=body["recipe"])
        state.events[job_id] = scripted_events()
        return JSONResponse(state.jobs[job_id], 202)

    def find_job(request: Request) -> dict[str, Any] | None:
        return state.jobs.get(request.path_params["id"])

    async def show_job(request: Request) -> Response:
        if not authorized(request):
            return problem(401, "Unauthorized", "missing or unknown API key")
        job = find_job(request)
        return JSONResponse(job) if job else problem(404, "Not Found", f"job {request.path_params['id']} not found")

    async def cancel(request: Request) -> Response:
        job = find_job(request)
        if job is None:
            return problem(404, "Not Found")
        if job["status"] in ("succeeded", "failed", "canceled"):
            return problem(409, "Conflict", f"job is already {job['status']}", type="https://quant/errors/terminal")
        job["status"] = "canceling"
        return JSONResponse(job, 202)

    async def events(request: Request) -> Response:
        job_id = request.path_params["id"]
        if find_job(request) is None:
            return problem(404, "Not Found", f"job {job_id} not found")
        last = request.headers.get("last-event-id")
        state.event_connections.append((job_id, last))
        pending = [event for event in state.events.get(job_id, []) if event["id"] > int(last or 0)]
        cut_after, how = state.drops.pop(job_id, (None, ""))

        async def body() -> AsyncIterator[str]:
            yield "retry: 10\n: connected\n\n"
            for sent, event in enumerate(pending):
                if sent == cut_after:
                    if how == "raise":
                        raise ConnectionResetError("simulated network drop")
                    return
                data = json.dumps(event)
                yield f"id: {event['id']}\nevent: {event['kind']}\ndata: {data}\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    async def report(request: Request) -> Response:
        return JSONResponse(REPORT) if find_job(request) else problem(404, "Not Found")

    async def artifacts(request: Request) -> Response:
        job_id = request.path_params["id"]
        listing = [
            {
                "name": name,
                "media_type": "application/octet-stream",
                "size_bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "url": f"/api/v1/jobs/{job_id}/artifacts/{name}",
            }
            for name, data in ARTIFACTS.items()
        ]
        return JSONResponse(listing)

    async def artifact(request: Request) -> Response:
        data = ARTIFACTS.get(request.path_params["name"])
        if data is None:
            return problem(404, "Not Found")
        requested = request.headers.get("range")
        state.ranges.append(requested)
        if requested and not state.ignore_range:
            start = int(requested.removeprefix("bytes=").split("-")[0])
            if start >= len(data):
                return Response(status_code=416, headers={"Content-Range": f"bytes */{len(data)}"})
            headers = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}", "Accept-Ranges": "bytes"}
            return Response(data[start:], status_code=206, headers=headers, media_type="application/octet-stream")
        return Response(data, headers={"Accept-Ranges": "bytes"}, media_type="application/octet-stream")

    async def broken(request: Request) -> Response:
        return Response("<html><body>502 Bad Gateway</body></html>", status_code=502, media_type="text/html")

    prefix = "/api/v1"
    return Starlette(
        routes=[
            Route(f"{prefix}/models", upload, methods=["POST"]),
            Route(f"{prefix}/models", list_collection, methods=["GET"]),
            Route(f"{prefix}/models/{{id}}", show_model, methods=["GET"]),
            Route(f"{prefix}/datasets", upload, methods=["POST"]),
            Route(f"{prefix}/datasets/{{id}}", show_dataset, methods=["GET"]),
            Route(f"{prefix}/jobs", submit, methods=["POST"]),
            Route(f"{prefix}/jobs", list_collection, methods=["GET"]),
            Route(f"{prefix}/jobs/broken", broken, methods=["GET"]),
            Route(f"{prefix}/jobs/{{id}}", show_job, methods=["GET"]),
            Route(f"{prefix}/jobs/{{id}}/cancel", cancel, methods=["POST"]),
            Route(f"{prefix}/jobs/{{id}}/events", events, methods=["GET"]),
            Route(f"{prefix}/jobs/{{id}}/report", report, methods=["GET"]),
            Route(f"{prefix}/jobs/{{id}}/artifacts", artifacts, methods=["GET"]),
            Route(f"{prefix}/jobs/{{id}}/artifacts/{{name}}", artifact, methods=["GET"]),
        ]
    )


def _public(item: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in item.items() if not key.startswith("_")}


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeApi]:
    """A running fake API; QUANT_API_URL and QUANT_API_KEY point the CLI at it."""
    state = FakeApi()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(build_app(state), log_level="critical", access_log=False, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the fake API did not start within 10 s"
        time.sleep(0.01)
    state.url = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("QUANT_API_URL", state.url)
    monkeypatch.setenv("QUANT_API_KEY", API_KEY)
    try:
        yield state
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
