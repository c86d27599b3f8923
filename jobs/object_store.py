"""The store as an S3-compatible bucket (AWS S3, MinIO, ...), `QUANT_STORAGE_URL=s3://bucket/prefix`.

Credentials and region come from the usual AWS variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
`AWS_DEFAULT_REGION`, ...); `QUANT_STORAGE_ENDPOINT_URL` points at a server other than AWS. Uploads are
multipart: parts go out as they arrive, so neither the API nor the store holds a whole file in memory,
and an upload that fails is aborted (the sweep aborts those a crash left, `abort_stale_uploads`).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from jobs.storage import CHUNK, UPLOADS, StagedUpload, Store, StoredObject

# S3 wants parts of at least 5 MiB (but the last); 8 MiB is what boto3's own transfers use.
PART_BYTES = 8 * 1024 * 1024


def _missing(exc: ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound")


class ObjectUpload(StagedUpload):
    """A multipart upload to a temporary key, teed into a local copy (`path`) for inspection."""

    def __init__(self, store: ObjectStore, scratch: Path) -> None:
        self.store = store
        scratch.mkdir(parents=True, exist_ok=True)
        name = uuid.uuid4().hex
        self.path = scratch / f".upload-{name}.part"
        self.handle = self.path.open("wb")
        self.temporary = store.key(f"{UPLOADS}/{name}")
        self.upload_id = store.client.create_multipart_upload(Bucket=store.bucket, Key=self.temporary)["UploadId"]
        self.parts: list[dict] = []
        self.buffer = bytearray()

    def write(self, data: bytes) -> None:
        self.handle.write(data)
        self.buffer += data

    def pending(self) -> bool:
        return len(self.buffer) >= PART_BYTES

    def send(self) -> None:
        while len(self.buffer) >= PART_BYTES:
            # one copy of the part (a bytearray slice, then bytes(), would be two: 16 MiB more at the peak)
            with memoryview(self.buffer) as view:
                part = bytes(view[:PART_BYTES])
            del self.buffer[:PART_BYTES]
            self._part(part)

    def _part(self, body: bytes) -> None:
        number = len(self.parts) + 1
        answer = self.store.client.upload_part(
            Bucket=self.store.bucket, Key=self.temporary, UploadId=self.upload_id, PartNumber=number, Body=body
        )
        self.parts.append({"ETag": answer["ETag"], "PartNumber": number})

    def finish(self) -> None:
        self.handle.close()
        self.send()
        if self.buffer or not self.parts:
            self._part(bytes(self.buffer))
            self.buffer.clear()

    def commit(self, key: str) -> None:
        client, bucket = self.store.client, self.store.bucket
        client.complete_multipart_upload(
            Bucket=bucket, Key=self.temporary, UploadId=self.upload_id, MultipartUpload={"Parts": self.parts}
        )
        self.upload_id = None
        # The key is known only once the upload has been inspected; a server-side copy, no bytes through here.
        client.copy({"Bucket": bucket, "Key": self.temporary}, bucket, self.store.key(key))
        client.delete_object(Bucket=bucket, Key=self.temporary)
        self.path.unlink(missing_ok=True)

    def abort(self) -> None:
        self.handle.close()
        self.path.unlink(missing_ok=True)
        if self.upload_id is not None:
            upload_id, self.upload_id = self.upload_id, None
            self.store.client.abort_multipart_upload(Bucket=self.store.bucket, Key=self.temporary, UploadId=upload_id)


class ObjectStore(Store):
    def __init__(self, client, bucket: str, prefix: str, scratch: Path) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        self.scratch = scratch

    @classmethod
    def from_url(cls, url: str, *, endpoint_url: str | None, scratch: Path) -> ObjectStore:
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise ValueError(f"QUANT_STORAGE_URL must be s3://bucket/prefix or file:///path, not {url!r}")
        config = Config(retries={"max_attempts": 5, "mode": "standard"}, s3={"addressing_style": "path"})
        client = boto3.client("s3", endpoint_url=endpoint_url, config=config)
        return cls(client, parts.netloc, parts.path, scratch)

    def key(self, key: str) -> str:
        return self.prefix + key

    def begin_upload(self) -> ObjectUpload:
        return ObjectUpload(self, self.scratch)

    def put_file(self, source: Path, key: str) -> tuple[int, str]:
        digest = hashlib.sha256()
        size = 0
        with source.open("rb") as handle:
            while chunk := handle.read(CHUNK):
                digest.update(chunk)
                size += len(chunk)
        # upload_file switches to a multipart upload past 8 MiB; an object appears only when complete.
        self.client.upload_file(str(source), self.bucket, self.key(key))
        return size, digest.hexdigest()

    def fetch(self, key: str, target: Path) -> None:
        self.client.download_file(self.bucket, self.key(key), str(target))

    def read_range(self, key: str, start: int, end: int) -> Iterator[bytes]:
        if end <= start:
            return
        answer = self.client.get_object(Bucket=self.bucket, Key=self.key(key), Range=f"bytes={start}-{end - 1}")
        body = answer["Body"]
        try:
            yield from body.iter_chunks(CHUNK)
        finally:
            body.close()

    def size(self, key: str) -> int:
        try:
            return self.client.head_object(Bucket=self.bucket, Key=self.key(key))["ContentLength"]
        except ClientError as exc:
            if _missing(exc):
                raise FileNotFoundError(key) from exc
            raise

    def move(self, source: str, key: str) -> None:
        try:
            self.client.copy({"Bucket": self.bucket, "Key": self.key(source)}, self.bucket, self.key(key))
        except ClientError as exc:
            if not _missing(exc):
                raise
            self.size(key)  # a retried move finds its source gone and its target there; else FileNotFoundError
            return
        self.client.delete_object(Bucket=self.bucket, Key=self.key(source))

    def delete_prefix(self, prefix: str) -> None:
        batch: list[dict] = []
        for stored in self.list(prefix):
            batch.append({"Key": self.key(stored.key)})
            if len(batch) == 1000:  # DeleteObjects takes at most 1000 keys
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
                batch = []
        if batch:
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self.key(key))

    def list(self, prefix: str = "") -> Iterator[StoredObject]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.key(prefix))
        for page in pages:
            for item in page.get("Contents", []):
                key = item["Key"].removeprefix(self.prefix)
                yield StoredObject(key, item["Size"], item["LastModified"].timestamp())

    def presign(self, key: str, *, seconds: int, filename: str, media_type: str) -> str:
        return self.client.generate_presigned_url(
            "get_object",
            Params={
                "Bucket": self.bucket,
                "Key": self.key(key),
                "ResponseContentDisposition": f'attachment; filename="{filename}"',
                "ResponseContentType": media_type,
            },
            ExpiresIn=seconds,
        )

    def abort_stale_uploads(self, older_than: float) -> int:
        aborted = 0
        pages = self.client.get_paginator("list_multipart_uploads").paginate(
            Bucket=self.bucket, Prefix=self.key(UPLOADS)
        )
        for page in pages:
            for upload in page.get("Uploads", []):
                if upload["Initiated"].timestamp() < older_than:
                    self.client.abort_multipart_upload(
                        Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                    )
                    aborted += 1
        return aborted
