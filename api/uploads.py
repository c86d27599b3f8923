"""Stream an upload to the store with a size cap and a running SHA-256; never buffer it whole.

Accepts `multipart/form-data` with one file part named `file` (what browsers and curl -F send),
or a raw body (`application/octet-stream`) with the file name in `?filename=`. A body larger than
the cap is cut off as soon as it passes the cap (413), and the partial file is removed. The cap is
the smaller of the size limit and what is left of the project's storage quota; when the quota is
the one that binds, the 413 names it (`quota`, `limit`, `used`). Where uploads may be reused (below),
what is left is at least the project's largest reusable row, so that sending bytes it holds already
is not cut off for room it will not take. The route re-checks the quota in
the transaction that records the upload (`jobs.quotas.reserve_storage`), so concurrent uploads
cannot together pass it. Bytes go to the store as they arrive (`jobs.storage.StagedUpload`: a file
renamed into place, or a multipart upload to an object store, one part in memory at a time); the
route commits the upload under its key or aborts it.

An upload of bytes the project already holds (same SHA-256, a ready model or dataset) is answered
with that row (200, not 201) unless the request says `?reuse=false`: nothing is stored, the quota is
not charged again, and the streamed upload is aborted (`stored_copy`).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from fastapi import Query, Request
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.concurrency import run_in_threadpool

from api.metrics import UPLOAD_BYTES
from api.problems import Problem
from jobs import uploaded
from jobs.config import Settings
from jobs.db import session_scope
from jobs.keys import KeyProject
from jobs.quotas import QuotaExceeded, QuotaUse, storage_use
from jobs.storage import StagedUpload, Store
from jobs.uploaded import Stored

# Multipart framing (boundaries, part headers) a Content-Length may carry beyond the file itself.
MULTIPART_SLACK = 64 * 1024

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


ReuseQuery = Annotated[
    bool,
    Query(
        description="When the project already holds a ready upload with the same SHA-256, answer with it "
        "(200) instead of storing a copy (201). false: always store a new one."
    ),
]


@dataclass(frozen=True)
class Upload:
    staged: StagedUpload  # commit it under the row's key, or abort it
    filename: str
    size_bytes: int
    sha256: str

    @property
    def path(self) -> Path:
        """A local copy of the received bytes, for inspecting an archive's listing."""
        return self.staged.path

    async def commit(self, key: str) -> None:
        await run_in_threadpool(self.staged.commit, key)

    async def abort(self) -> None:
        await run_in_threadpool(self.staged.abort)


def _clean_filename(raw: str, fallback: str) -> str:
    name = os.path.basename(raw.replace("\\", "/")).strip()
    name = _SAFE_NAME.sub("_", name)[:200]
    return name or fallback


@dataclass(frozen=True)
class StorageRoom:
    use: QuotaUse
    reusable_bytes: int = 0  # the largest row an upload could be answered with (`stored_copy`)


async def storage_quota(settings: Settings, project: KeyProject, *, reusable: type[Stored] | None) -> StorageRoom:
    """The project's storage use now; pass it to `receive_upload` to cut uploads off at the quota.
    `reusable`: the kind of row a re-upload is answered with, or None when uploads are not reused."""

    def read() -> StorageRoom:
        with session_scope(settings.resolved_database_url) as session:
            use = storage_use(session=session, project=project, settings=settings)
            if reusable is None:
                return StorageRoom(use)
            return StorageRoom(use, uploaded.largest_reusable(session=session, entity=reusable, project_id=project.id))

    return await run_in_threadpool(read)


async def stored_copy(
    settings: Settings, project: KeyProject, upload: Upload, room: StorageRoom, entity: type[Stored]
) -> Stored | None:
    """The project's ready row of `entity` holding the upload's bytes, the upload aborted; None
    when there is none, and the caller stores the upload. An upload let past the quota only because a
    row that large could have been reused (`StorageRoom`) is refused here when none is."""
    if room.reusable_bytes == 0:  # reuse not asked for, or nothing to reuse
        return None

    def find() -> Stored | None:
        with session_scope(settings.resolved_database_url) as session:
            return uploaded.find_reusable(session=session, entity=entity, project_id=project.id, sha256=upload.sha256)

    try:
        row = await run_in_threadpool(find)
        if row is None and upload.size_bytes > room.use.remaining:
            raise QuotaExceeded(room.use, upload.size_bytes)
    except BaseException:
        await upload.abort()
        raise
    if row is not None:
        await upload.abort()
    return row


@dataclass(frozen=True)
class _Cap:
    """The byte count an upload may reach: the size limit, or what is left of the quota if smaller."""

    limit: int
    quota: QuotaUse | None = None  # set when the quota, not the size limit, binds

    @classmethod
    def of(cls, limit: int, room: StorageRoom | None) -> _Cap:
        allowed = limit if room is None else max(room.use.remaining, room.reusable_bytes)
        if room is not None and allowed < limit:
            return cls(allowed, room.use)
        return cls(limit)

    def refusal(self, size: int) -> Exception:
        if self.quota is not None:
            return QuotaExceeded(self.quota, size)
        return Problem(413, f"upload of {size} bytes exceeds the limit of {self.limit} bytes", slug="upload-too-large")


class _Sink:
    """Writes one file part to the store, counting bytes and hashing as they arrive."""

    def __init__(self, staged: StagedUpload, cap: _Cap) -> None:
        self.staged = staged
        self.cap = cap
        self.size = 0
        self.digest = hashlib.sha256()

    def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.cap.limit:
            raise self.cap.refusal(self.size)
        self.digest.update(data)
        self.staged.write(data)
        UPLOAD_BYTES.inc(len(data))

    async def drain(self) -> None:
        """Send a full part to the store off the event loop; the body is read no faster than it goes out."""
        if self.staged.pending():
            await run_in_threadpool(self.staged.send)


async def receive_upload(
    request: Request, *, store: Store, limit: int, fallback_name: str, quota: StorageRoom | None = None
) -> Upload:
    """Stream the request body to `store`; the caller commits the upload under its key or aborts it.

    `quota` is the project's storage use (from `storage_quota`), or None for no quota. Past the quota
    but within the room left for a reusable row, an upload that is not reused is refused when its row
    is recorded (`jobs.quotas.reserve_storage`)."""
    cap = _Cap.of(limit, quota)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap.limit + MULTIPART_SLACK:
        raise cap.refusal(int(declared))
    content_type, params = parse_options_header(request.headers.get("content-type", ""))
    sink = _Sink(await run_in_threadpool(store.begin_upload), cap)
    try:
        if content_type == b"multipart/form-data":
            filename = await _receive_multipart(request, sink, params.get(b"boundary"))
        elif content_type in (b"application/octet-stream", b""):
            async for chunk in request.stream():
                sink.write(chunk)
                await sink.drain()
            filename = request.query_params.get("filename", "")
        else:
            raise Problem(
                415,
                "send the file as multipart/form-data (field 'file') or application/octet-stream",
                slug="unsupported-media-type",
            )
        if sink.size == 0:
            raise Problem(422, "the uploaded file is empty", slug="empty-upload")
        await run_in_threadpool(sink.staged.finish)
    except BaseException:
        await run_in_threadpool(sink.staged.abort)
        raise
    return Upload(
        staged=sink.staged,
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
            await sink.drain()
        parser.finalize()
    except MultipartParseError as exc:
        raise Problem(400, f"malformed multipart body: {exc}", slug="bad-multipart") from exc
    if not state["seen_file"]:
        raise Problem(422, "the multipart body has no part named 'file'", slug="missing-file")
    return state["filename"]
