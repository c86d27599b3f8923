"""Artifact downloads with Range refusals as problem+json, from the local disk or an object store.

Starlette's `FileResponse` answers a malformed Range (400) and one past the end of the file (416)
itself, in plain text or with no body, from inside its own `__call__`. It parses the header in one
classmethod; overriding it turns those refusals into `Problem`s, which the route's exception
handling (`api.problems`) sends like every other error, before any byte of the file goes out.

An object in an object store goes out through the same response (`StoredArtifactResponse`): its
Range, If-Range and HEAD handling stay Starlette's; only the file it reads is a stream of the object
(`_ObjectReader`), opened at the offset the range starts at, so the API holds one chunk at a time.
"""

from __future__ import annotations

import os
import stat
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import anyio
from fastapi.responses import FileResponse
from starlette.responses import MalformedRangeHeader, RangeNotSatisfiable
from starlette.types import Receive, Scope, Send

from api.problems import Problem
from jobs.storage import Store

RANGE_FIELD = "header.range"  # as FastAPI names a header in validation errors


class ArtifactResponse(FileResponse):
    @classmethod
    def _parse_range_header(cls, http_range: str, file_size: int) -> list[tuple[int, int]]:
        try:
            return super()._parse_range_header(http_range, file_size)
        except MalformedRangeHeader as exc:
            message = exc.content.removeprefix("Range header: ")
            raise Problem(
                400,
                f"malformed Range header: {message}",
                slug="bad-range",
                errors=[{"field": RANGE_FIELD, "message": message}],
            ) from exc
        except RangeNotSatisfiable as exc:
            message = f"the range starts past the end of the file ({exc.max_size} bytes)"
            raise Problem(
                416,
                message,
                slug="range-not-satisfiable",
                errors=[{"field": RANGE_FIELD, "message": message}],
                headers={"Content-Range": f"bytes */{exc.max_size}"},
            ) from exc


class _ObjectReader:
    """The two calls FileResponse makes on a file, `seek` and `read(n)`, over a stored object. `read`
    returns exactly n bytes until the end: FileResponse takes a short read for the end of the file."""

    def __init__(self, store: Store, key: str, size: int) -> None:
        self.store, self.key, self.size = store, key, size
        self.chunks: Iterator[bytes] | None = None
        self.offset = 0
        self.buffer = b""

    async def seek(self, offset: int) -> None:
        await self.aclose()
        self.offset, self.buffer = offset, b""

    async def read(self, size: int) -> bytes:
        if self.chunks is None:
            self.chunks = self.store.read_range(self.key, self.offset, self.size)
        while len(self.buffer) < size:
            chunk = await anyio.to_thread.run_sync(next, self.chunks, b"")
            if not chunk:
                break
            self.buffer += chunk
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        self.offset += len(data)
        return data

    async def aclose(self) -> None:
        if self.chunks is not None:
            chunks, self.chunks = self.chunks, None
            with anyio.CancelScope(shield=True):  # the store's connection goes back even when canceled
                await anyio.to_thread.run_sync(chunks.close)


class StoredArtifactResponse(ArtifactResponse):
    """An artifact streamed from a store that is not this host's disk."""

    def __init__(self, store: Store, key: str, *, size: int, modified: float, **kwargs) -> None:
        # Regular-file metadata for the headers FileResponse derives from it (Content-Length, Last-Modified).
        metadata = os.stat_result((stat.S_IFREG | 0o644, 0, 0, 1, 0, 0, size, modified, modified, modified))
        super().__init__(key, stat_result=metadata, **kwargs)
        self.store, self.key, self.size = store, key, size

    @asynccontextmanager
    async def _open_file(self) -> AsyncIterator[_ObjectReader]:
        reader = _ObjectReader(self.store, self.key, self.size)
        try:
            yield reader
        finally:
            await reader.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # `path` is a key, not a file the server could send by itself (ASGI pathsend).
        extensions = {
            name: value for name, value in scope.get("extensions", {}).items() if name != "http.response.pathsend"
        }
        await super().__call__({**scope, "extensions": extensions}, receive, send)
