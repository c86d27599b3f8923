"""RFC 9457 problem details: every error the API returns is `application/problem+json`.

    {"type": "https://quant.example/problems/<slug>", "title": ..., "status": ..., "detail": ...,
     "instance": "/api/v1/...", "errors": [{"field": "recipe.calibration.percentile", "message": ...}]}

`errors` appears on validation failures and names each offending field by its dotted path; a quota
refusal adds `quota`, `limit` and `used`.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from jobs.quotas import STORAGE, QuotaExceeded

MEDIA_TYPE = "application/problem+json"
TYPE_BASE = "https://quantservice.dev/problems/"
log = logging.getLogger(__name__)

_TITLES = {
    400: "Bad request",
    401: "Unauthorized",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict",
    411: "Length required",
    413: "Content too large",
    415: "Unsupported media type",
    416: "Range not satisfiable",
    422: "Unprocessable content",
    429: "Too many requests",
    500: "Internal server error",
    503: "Service unavailable",
}


class Problem(Exception):
    def __init__(
        self,
        status: int,
        detail: str,
        *,
        slug: str | None = None,
        title: str | None = None,
        errors: list[dict[str, str]] | None = None,
        headers: dict[str, str] | None = None,
        extensions: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.slug = slug or _TITLES.get(status, "error").lower().replace(" ", "-")
        self.title = title or _TITLES.get(status, "Error")
        self.errors = errors
        self.headers = headers
        self.extensions = extensions or {}


def problem_response(request: Request, problem: Problem) -> JSONResponse:
    body: dict[str, Any] = {
        "type": TYPE_BASE + problem.slug,
        "title": problem.title,
        "status": problem.status,
        "detail": problem.detail,
        "instance": request.url.path,
    }
    if problem.errors:
        body["errors"] = problem.errors
    body.update(problem.extensions)
    return JSONResponse(body, status_code=problem.status, media_type=MEDIA_TYPE, headers=problem.headers)


def field_errors(errors: Any, *, drop_prefix: tuple[str, ...] = ("body",)) -> list[dict[str, str]]:
    """Pydantic errors as [{field, message}], the field a dotted path the client sent."""
    out = []
    for error in errors:
        loc = [str(part) for part in error.get("loc", ())]
        while loc and loc[0] in drop_prefix:
            loc = loc[1:]
        message = error.get("msg", "invalid")
        if error.get("type") == "extra_forbidden":
            message = "unknown field"
        elif error.get("type") == "json_invalid":  # its loc ends in the byte offset, not a field
            reason = error.get("ctx", {}).get("error", "")
            message = f"not valid JSON at byte {loc[-1]}: {reason}" if loc else "not valid JSON"
            loc = []
        out.append({"field": ".".join(loc) or "(body)", "message": message})
    return out


def quota_problem(exc: QuotaExceeded) -> Problem:
    """413 for storage, 429 for concurrent jobs; `quota`, `limit` and `used` as extension members."""
    status = 413 if exc.use.quota == STORAGE else 429
    return Problem(
        status,
        str(exc),
        slug="quota-exceeded",
        title="Quota exceeded",
        extensions={"quota": exc.use.quota, "limit": exc.use.limit, "used": exc.use.used},
    )


# The body of every error response, as a JSON Schema (RFC 9457 members plus `errors`).
PROBLEM_SCHEMA: dict[str, Any] = {
    "title": "Problem",
    "type": "object",
    "required": ["type", "title", "status", "detail", "instance"],
    "properties": {
        "type": {"type": "string", "description": "URI naming the kind of problem"},
        "title": {"type": "string"},
        "status": {"type": "integer", "minimum": 400, "maximum": 599},
        "detail": {"type": "string"},
        "instance": {"type": "string", "description": "The request path"},
        "errors": {
            "type": "array",
            "description": "On validation failures: each offending field by its dotted path",
            "items": {
                "type": "object",
                "required": ["field", "message"],
                "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
}


def document_problems(schema: dict[str, Any]) -> dict[str, Any]:
    """Make the OpenAPI document say what the handlers below send: every operation may answer any
    4xx, always as `application/problem+json` with `PROBLEM_SCHEMA`; error codes a route declares
    (503 where a server it needs is down) get the same body. FastAPI's default 422 entry
    (`HTTPValidationError` as `application/json`) is never sent, so it is replaced. Mutates and
    returns `schema`."""
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    schemas["Problem"] = PROBLEM_SCHEMA
    body = {MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}}
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            for code, response in responses.items():
                if code[0] in "45":
                    response["content"] = body
            responses["4XX"] = {"description": "Client error: a problem document (RFC 9457)", "content": body}
    return schema


def install(app: FastAPI) -> None:
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document_problems(generate())
        return app.openapi_schema

    app.openapi = openapi

    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem) -> JSONResponse:
        return problem_response(request, exc)

    @app.exception_handler(QuotaExceeded)
    async def _quota(request: Request, exc: QuotaExceeded) -> JSONResponse:
        return problem_response(request, quota_problem(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = field_errors(exc.errors())
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        return problem_response(
            request, Problem(422, f"invalid request: {detail}", slug="validation-error", errors=errors)
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        return problem_response(request, Problem(exc.status_code, detail, headers=getattr(exc, "headers", None)))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem_response(request, Problem(500, "an unexpected error occurred; it has been logged"))
