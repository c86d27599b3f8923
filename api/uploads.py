"""Stream an upload to disk with a size cap and a running SHA-256; never buffer it whole.

Accepts `multipart/form-data` with one file part named `file` (what browsers and curl -F send),
or a raw body (`application/octet-stream`) with the file name in `?filename=`. A body larger than
the cap is cut off as soon as it passes the cap (413), and the partial file is removed.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

from fastapi import Request
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from api.problems import Problem

_SAFE_NAME = re.compile(r"[^A-Za-z0-9._ -]")

# OpenAPI description of the body the upload routes read by hand.
UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {"file": {"type": "string", "format": "binary"}},
                }
            },
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        },
    }
}


@dataclass(frozen=True)
class Upload:
    path: Path
    filename: str
    size_bytes: int
    sha256: str


def _clean_filename(raw: str, fallback: str) -> str:
    name = os.path.basename(raw.replace("\\", "/")).strip()
    name = _SAFE_NAME.sub("_", name)[:200]
    return name or fallback


class _Sink:
    """Writes one file part, counting bytes and hashing as they arrive."""

    def __init__(self, path: Path, limit: int) -> None:
        self.path = path
        self.limit = limit
        self.size = 0
        self.digest = hashlib.sha256()
        self.handle = path.open("wb")

    def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.limit:
            raise Problem(413, f"upload exceeds the limit of {self.limit} bytes", slug="upload-too-large")
        self.digest.update(data)
        self.handle.write(data)

    def close(self) -> None:
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()


async def receive_upload(request: Request, *, directory: Path, limit: int, fallback_name: str) -> Upload:
    """Stream the request body into `directory`; the caller renames or deletes the file."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit + 64 * 1024:
        raise Problem(413, f"upload of {declared} bytes exceeds the limit of {limit} bytes", slug="upload-too-large")
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f".upload-{uuid.uuid4().hex}.part"
    content_type, params = parse_options_header(request.headers.get("content-type", ""))
    sink = _Sink(target, limit)
    try:
        if content_type == b"multipart/form-data":
            filename = await _receive_multipart(request, sink, params.get(b"boundary"))
        elif content_type in (b"application/octet-stream", b""):
            async for chunk in request.stream():
                sink.write(chunk)
            filename = request.query_params.get("filename", "")
        else:
            raise Problem(
                415,
                "send the file as multipart/form-data (field 'file') or application/octet-stream",
                slug="unsupported-media-type",
            )
        sink.close()
        if sink.size == 0:
            raise Problem(422, "the uploaded file is empty", slug="empty-upload")
    except BaseException:
        sink.handle.close()
        target.unlink(missing_ok=True)
        raise
    return Upload(
        path=target,
        filename=_clean_filename(filename, fallback_name),
        size_bytes=sink.size,
        sha256=sink.digest.hexdigest(),
    )


async def _receive_multipart(request: Request, sink: _Sink, boundary: bytes | None) -> str:
    if not boundary:
        raise Problem(400, "multipart body without a boundary", slug="bad-multipart")
    state = {"field": b"", "value": b"", "headers": {}, "in_file": False, "seen_file": False, "filename": ""}

    def on_header_field(data: bytes, start: int, end: int) -> None:
        state["field"] += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        state["value"] += data[start:end]

    def on_header_end() -> None:
        state["headers"][state["field"].lower()] = state["value"]
        state["field"], state["value"] = b"", b""

    def on_headers_finished() -> None:
        _kind, options = parse_options_header(state["headers"].get(b"content-disposition", b""))
        is_file = options.get(b"name") == b"file" and not state["seen_file"]
        state["in_file"] = is_file
        if is_file:
            state["seen_file"] = True
            state["filename"] = options.get(b"filename", b"").decode("utf-8", "replace")

    def on_part_data(data: bytes, start: int, end: int) -> None:
        if state["in_file"]:
            sink.write(data[start:end])

    def on_part_end() -> None:
        state["in_file"] = False
        state["headers"] = {}

    parser = MultipartParser(
        boundary,
        {
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_header_end": on_header_end,
            "on_headers_finished": on_headers_finished,
            "on_part_data": on_part_data,
            "on_part_end": on_part_end,
        },
    )
    try:
        async for chunk in request.stream():
            parser.write(chunk)
        parser.finalize()
    except MultipartParseError as exc:
        raise Problem(400, f"malformed multipart body: {exc}", slug="bad-multipart") from exc
    if not state["seen_file"]:
        raise Problem(422, "the multipart body has no part named 'file'", slug="missing-file")
    return state["filename"]
