"""HTTP access to the quantization API.

One `Client` wraps an `httpx.Client` whose base URL ends in `/api/v1/`, so callers pass paths
relative to it (`"jobs"`, `job_path(job_id, "events")`). Every error answer becomes an `ApiError`
carrying the RFC 9457 problem document (`type`, `title`, `status`, `detail`, `errors`), or one
built from the status line when the body is not problem+json (a proxy's HTML 502, say).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import quote

import httpx

API_PREFIX = "/api/v1"
DEFAULT_URL = "http://127.0.0.1:8000"
USER_AGENT = "quantctl/0.1"


class ApiError(Exception):
    """The API answered with an error status; `problem` is the RFC 9457 document (possibly synthesized)."""

    def __init__(self, status: int, problem: Mapping[str, Any], *, method: str = "", url: str = "") -> None:
        self.status = status
        self.problem = dict(problem)
        self.method = method
        self.url = url
        super().__init__(f"{method} {url}: {status} {self.problem.get('title', '')}".strip())

    @classmethod
    def from_response(cls, response: httpx.Response) -> ApiError:
        """Build the error from an answer whose body has been read."""
        problem: dict[str, Any] = {}
        try:
            body = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = None
        if isinstance(body, dict):
            problem = body
        else:
            text = response.text.strip()
            if text:
                problem["detail"] = text[:300]
        problem.setdefault("title", response.reason_phrase or "HTTP error")
        problem.setdefault("status", response.status_code)
        request = response.request
        return cls(response.status_code, problem, method=request.method, url=str(request.url))

    def render(self) -> str:
        """Human-readable lines for stderr: title and status, detail, one line per invalid field."""
        title = str(self.problem.get("title") or "HTTP error")
        lines = [f"error: {title} (HTTP {self.status})"]
        detail = self.problem.get("detail")
        errors = self.problem.get("errors")
        if isinstance(detail, list) and errors is None:
            # FastAPI's default validation body ({"detail": [{"loc", "msg"}]}), should a route bypass problem+json.
            errors, detail = detail, None
        if detail and detail != title:
            lines.append(f"  {detail}")
        for entry in errors if isinstance(errors, list) else []:
            lines.append(f"  - {_format_field_error(entry)}")
        kind = self.problem.get("type")
        if kind and kind != "about:blank":
            lines.append(f"  type: {kind}")
        if self.status == 401:
            lines.append("  hint: pass --api-key or set QUANT_API_KEY")
        return "\n".join(lines)


class ProtocolError(Exception):
    """The server answered in a shape the client cannot follow (e.g. a pagination cursor that repeats)."""


def _format_field_error(entry: Any) -> str:
    if not isinstance(entry, Mapping):
        return str(entry)
    field = entry.get("field")
    if field is None and isinstance(entry.get("loc"), list):
        field = ".".join(str(part) for part in entry["loc"])
    message = entry.get("message", entry.get("msg", ""))
    return f"{field}: {message}" if field else str(message)


def api_base(url: str) -> str:
    """`http://host:8000` or `http://host:8000/api/v1` → `http://host:8000/api/v1/`."""
    url = url.rstrip("/")
    if not url.endswith(API_PREFIX):
        url += API_PREFIX
    return url + "/"


def job_path(job_id: str, *rest: str) -> str:
    """`jobs/{id}/...` with every user-given segment percent-encoded (no `../` tricks via an id)."""
    return "/".join(["jobs", quote(job_id, safe=""), *(quote(part, safe="") for part in rest)])


def resource_path(collection: str, resource_id: str) -> str:
    return f"{collection}/{quote(resource_id, safe='')}"


def raise_for_problem(response: httpx.Response) -> None:
    """Raise `ApiError` for a 4xx/5xx answer (reading a streamed body first)."""
    if response.is_success:
        return
    response.read()
    raise ApiError.from_response(response)


def json_body(response: httpx.Response) -> Any:
    """The JSON of a successful answer; `ProtocolError` when it is not JSON (a login page, a wrong URL)."""
    try:
        return response.json()
    except ValueError as exc:
        kind = response.headers.get("content-type", "no content type")
        raise ProtocolError(
            f"{response.request.method} {response.request.url} answered {kind}, not JSON; is --url the API?"
        ) from exc


class Client:
    """The API at `url` (with or without the `/api/v1` suffix), authenticated by `X-API-Key`.

    `timeout` (seconds) bounds connecting and each read/write; long-polling callers (SSE, uploads
    that wait for validation) pass their own per request.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if api_key:
            headers["X-API-Key"] = api_key
        self.base_url = api_base(url)
        self.http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            transport=transport,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = self.http.request(method, path, **kwargs)
        raise_for_problem(response)
        return response

    def get_json(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        return json_body(self.request("GET", path, params=_drop_none(params)))

    def post_json(self, path: str, body: Any = None) -> Any:
        return json_body(self.request("POST", path, json=body))

    def pages(self, path: str, params: Mapping[str, Any] | None = None, *, cursor: str | None = None) -> Iterator[dict]:
        """Yield `{items, next_cursor}` pages from `cursor` on, following `next_cursor` while the caller iterates."""
        seen: set[str] = set()
        while True:
            page = self.get_json(path, {**(params or {}), "cursor": cursor})
            yield page
            cursor = page.get("next_cursor")
            if not cursor:
                return
            if cursor in seen:
                raise ProtocolError(f"the server repeated pagination cursor {cursor!r}")
            seen.add(cursor)


def _drop_none(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if params is None:
        return None
    return {key: value for key, value in params.items() if value is not None}
