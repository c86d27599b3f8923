"""Moving files: streamed multipart uploads with a progress bar, resumable checked downloads.

Uploads are never read into memory: httpx's multipart encoder reads the file in 64 KiB chunks
through `_ProgressReader`, and the file's size (fstat) gives the request a Content-Length.

A download goes to `NAME.part` beside the destination and is renamed into place only once its size
and SHA-256 match what the artifact listing announced. An existing `.part` is resumed with
`Range: bytes=<its size>-`; a server that ignores the range (200) restarts the file from zero. An
API that serves artifacts from an object store may answer with a redirect to a short-lived presigned
URL (`QUANT_STORAGE_PRESIGN`); it is followed with the same Range but without the API key, which
the store has no use for and must not see.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import httpx
from tqdm import tqdm

from cli.client import Client, json_body, raise_for_problem
from cli.watch import progress_bar

CHUNK = 1024 * 1024
UPLOAD_READ_TIMEOUT = 300.0  # seconds; POST /models answers only after the validation wait


class DownloadError(Exception):
    """The downloaded bytes do not match the artifact's announced size or SHA-256."""


class _ProgressReader:
    """A binary file whose reads advance a progress bar; a rewind (httpx retrying) resets the bar."""

    def __init__(self, file: BinaryIO, bar: tqdm) -> None:
        self._file = file
        self._bar = bar
        self.name = file.name

    def read(self, size: int = -1) -> bytes:
        chunk = self._file.read(size)
        self._bar.update(len(chunk))
        return chunk

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        position = self._file.seek(offset, whence)
        if whence == os.SEEK_SET and offset == 0:
            self._bar.reset(total=self._bar.total)
        return position

    def tell(self) -> int:
        return self._file.tell()

    def fileno(self) -> int:
        return self._file.fileno()


@contextlib.contextmanager
def model_upload(path: Path) -> Iterator[Path]:
    """What to send for the model at `path`: the file itself, or, when the external data file that
    `torch.onnx.export(..., dynamo=True)` writes beside it (`<name>.data`) is there, a temporary zip of
    both, which the service unpacks (an `.onnx` alone would be refused: its weights are not in it)."""
    data = path.with_name(path.name + ".data")
    if path.suffix.lower() != ".onnx" or not data.is_file():
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="quantctl-") as scratch:
        bundle = Path(scratch) / f"{path.name}.zip"
        with zipfile.ZipFile(bundle, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            archive.write(path, path.name)
            archive.write(data, data.name)
        yield bundle


def upload(
    client: Client, collection: str, path: Path, *, filename: str | None = None, progress: bool | None = None
) -> tuple[int, dict[str, Any]]:
    """POST `path` as multipart field `file` (named `filename`, else its own name) to `collection`;
    returns (status code, JSON body)."""
    size = path.stat().st_size
    with (
        path.open("rb") as file,
        progress_bar(
            total=size, desc=f"upload {path.name}", enabled=progress, unit="B", unit_scale=True, unit_divisor=1024
        ) as bar,
    ):
        reader = _ProgressReader(file, bar)
        response = client.http.post(
            collection,
            files={"file": (filename or path.name, reader, "application/octet-stream")},
            timeout=_timeout(client, read=UPLOAD_READ_TIMEOUT),
        )
    raise_for_problem(response)
    return response.status_code, json_body(response)


def download(
    client: Client,
    url_path: str,
    dest: Path,
    *,
    size: int | None = None,
    sha256: str | None = None,
    progress: bool | None = None,
) -> bool:
    """Fetch `url_path` into `dest` (via `dest.part`); False when `dest` already held the same bytes."""
    if sha256 and dest.is_file() and _sha256(dest) == sha256:
        return False
    part = dest.with_name(dest.name + ".part")
    for _ in range(2):  # a second round only after discarding a `.part` the server cannot resume
        if _fetch(client, url_path, part, size=size, progress=progress):
            break
        part.unlink(missing_ok=True)
    else:
        raise DownloadError(f"{dest.name}: the server refused to resume and to restart the download")
    try:
        _verify(part, size=size, sha256=sha256)
    except DownloadError:
        part.unlink(missing_ok=True)
        raise
    os.replace(part, dest)
    return True


def _fetch(client: Client, url_path: str, part: Path, *, size: int | None, progress: bool | None) -> bool:
    """Append the missing bytes to `part`; False when `part` must be discarded and fetched again."""
    offset = part.stat().st_size if part.exists() else 0
    if size is not None and offset > size:
        return False
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    with _stream(client, url_path, headers) as response:
        if response.status_code == 416 and offset:
            # Nothing left past `offset`: the `.part` is complete if the announced size says so.
            return size is None or offset == size
        raise_for_problem(response)
        if response.status_code == 206:
            if _range_start(response.headers.get("content-range")) != offset:
                return False
            mode = "ab"
        else:  # 200: the whole file, from byte 0
            offset, mode = 0, "wb"
        length = _int(response.headers.get("content-length"), None)
        total = size if size is not None else (offset + length if length is not None else None)
        with (
            part.open(mode) as file,
            progress_bar(
                total=total,
                desc=part.name.removesuffix(".part"),
                enabled=progress,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                initial=offset,
            ) as bar,
        ):
            for chunk in response.iter_bytes(CHUNK):
                file.write(chunk)
                bar.update(len(chunk))
    return True


@contextlib.contextmanager
def _stream(client: Client, url_path: str, headers: dict[str, str]) -> Iterator[httpx.Response]:
    """GET `url_path`, following one redirect to a presigned URL with a client that carries no credentials."""
    timeout = _timeout(client, read=120.0)
    with client.http.stream("GET", url_path, headers=headers, timeout=timeout) as response:
        if not response.is_redirect:
            yield response
            return
        location = str(response.url.join(response.headers["location"]))
    with httpx.Client(timeout=timeout) as bare, bare.stream("GET", location, headers=headers) as response:
        yield response


def _verify(path: Path, *, size: int | None, sha256: str | None) -> None:
    actual_size = path.stat().st_size
    if size is not None and actual_size != size:
        raise DownloadError(f"{path.name}: got {actual_size} bytes, expected {size}")
    if sha256 and (digest := _sha256(path)) != sha256:
        raise DownloadError(f"{path.name}: SHA-256 {digest} does not match the announced {sha256}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _range_start(content_range: str | None) -> int | None:
    """`bytes 100-199/200` → 100."""
    if not content_range or not content_range.startswith("bytes "):
        return None
    return _int(content_range[6:].split("-", 1)[0], None)


def _int(value: str | None, default: int | None) -> int | None:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def _timeout(client: Client, *, read: float) -> httpx.Timeout:
    """The client's timeouts with a longer read timeout."""
    base = client.http.timeout
    return httpx.Timeout(base.connect, read=max(read, base.read or 0.0), write=base.write, pool=base.pool)
