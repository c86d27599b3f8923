"""Requests through the app in process, before it serves: the first request of a fresh worker pays for
lazy imports and first-use set-up (anyio's asyncio backend, route matching, dependency solving,
problem+json rendering), about 120 ms of CPU (`bench.request_cpu`, its warm-up line), during which the
requests queued behind it wait. `warm_up` pays it before the worker accepts a connection."""

from __future__ import annotations

from typing import Any

# Requests that need no key, touch no data and change nothing: liveness, and a job listing without a
# key (answered 401 by the key dependency, after routing and dependency solving).
WARM_UP_PATHS = ("/api/v1/health", "/api/v1/jobs")


async def asgi_get(app: Any, path: str, query: bytes = b"", headers: list[tuple[bytes, bytes]] = ()) -> int:
    """One GET through the ASGI app, with the scope a server would give it; the response status once
    its whole body was sent."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": query,
        "headers": [(b"host", b"127.0.0.1"), (b"accept", b"*/*"), *headers],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }
    status = 0

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


async def warm_up(app: Any) -> list[int]:
    """The statuses of the `WARM_UP_PATHS` requests (200 and 401 when all is well)."""
    return [await asgi_get(app, path) for path in WARM_UP_PATHS]
