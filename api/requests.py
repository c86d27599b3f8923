"""Per-request handling in front of the routes: request id, access log, JSON body size cap.

- `X-Request-ID`: taken from the request when it is a sane token (a proxy's id), else a new one;
  echoed in the response and bound to every log line of the request (`jobs.logs.request_id_var`).
- One access-log line per request (`api.access`): method, path, status, duration.
- Bodies of every route except the streamed uploads (operations whose OpenAPI request body is
  `api.uploads.UPLOAD_BODY`, which enforce their own cap while streaming) are read here, up to
  `max_json_body_bytes`, before the route sees them: a larger body gets 413 problem+json after at
  most that many bytes, whether it declared its Content-Length or came chunked. FastAPI would
  otherwise buffer any body a JSON route is sent, whatever its size.

A plain ASGI middleware (not BaseHTTPMiddleware), so streaming responses and context variables pass
through untouched.
"""

from __future__ import annotations

import logging
import re
import time
import uuid

from fastapi import FastAPI
from starlette.requests import Request
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.problems import Problem, problem_response
from api.uploads import UPLOAD_BODY
from jobs.logs import log_context
from jobs.recipe import MAX_LIST_ENTRIES

access_log = logging.getLogger("api.access")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class RequestContext:
    def __init__(self, app: ASGIApp, *, fastapi: FastAPI, max_body_bytes: int) -> None:
        self.app = app
        self.fastapi = fastapi
        self.max_body_bytes = max_body_bytes
        self._upload_routes: list[tuple[str, re.Pattern[str]]] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        supplied = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        request_id = supplied if _REQUEST_ID.match(supplied) else uuid.uuid4().hex
        status = 500
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", request_id.encode())]
            await send(message)

        with log_context(request_id=request_id):
            try:
                if scope["method"] in _BODY_METHODS and not self._is_upload(scope):
                    body = await self._read_capped(receive, _content_length(scope))
                    if body is None:
                        problem = Problem(
                            413,
                            f"request body exceeds the limit of {self.max_body_bytes} bytes for JSON requests; "
                            f"files go to the upload routes (/models, /datasets). "
                            f"A job request needs a few kilobytes: a recipe's lists (overrides, exclude.op_types, "
                            f"exclude.node_patterns) take at most {MAX_LIST_ENTRIES} entries each, and one "
                            f"shell-style pattern such as '/encoder/*' covers many nodes",
                            slug="body-too-large",
                            extensions={"limit": self.max_body_bytes},
                        )
                        await problem_response(Request(scope), problem)(scope, receive, send_with_id)
                        return
                    receive = _replay(body, receive)
                await self.app(scope, receive, send_with_id)
            finally:
                duration_ms = round((time.perf_counter() - started) * 1000, 1)
                access_log.info(
                    "%s %s %d %.1f ms",
                    scope["method"],
                    scope["path"],
                    status,
                    duration_ms,
                    extra={
                        "method": scope["method"],
                        "path": scope["path"],
                        "status": status,
                        "duration_ms": duration_ms,
                    },
                )

    def _is_upload(self, scope: Scope) -> bool:
        if self._upload_routes is None:  # from the OpenAPI document: the routes that declare UPLOAD_BODY
            self._upload_routes = [
                (method.upper(), compile_path(path)[0])
                for path, item in self.fastapi.openapi()["paths"].items()
                for method, operation in item.items()
                if operation.get("requestBody") == UPLOAD_BODY["requestBody"]
            ]
        return any(method == scope["method"] and regex.match(scope["path"]) for method, regex in self._upload_routes)

    async def _read_capped(self, receive: Receive, declared: int) -> bytes | None:
        """The whole body, or None as soon as it passes the cap (declared or counted)."""
        if declared > self.max_body_bytes:
            return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


def _content_length(scope: Scope) -> int:
    value = dict(scope["headers"]).get(b"content-length", b"")
    return int(value) if value.isdigit() else 0


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: wait for the disconnect, as the server would

    return replay
