"""Peak memory of the API process while it receives uploads of growing size.

    .venv/bin/python -m bench.upload_memory [--sizes 8,128,512] [--store local|s3]   (MiB)

Starts the real API and a validation worker (SQLite, the local Redis or the embedded broker, a
temporary storage root; with ``--store s3`` the uploads stream into a bucket of moto's S3 server on
127.0.0.1, as multipart uploads), uploads a body of each size as a streamed raw request (the body is not
a valid model, so validation refuses it and the upload is discarded), and reads the API process's
peak resident memory (VmHWM) after each one. Streaming to disk means the peak must not grow with
the upload size; buffering would add the upload's size to it. Prints a table.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from jobs.config import Settings
from jobs.queue import resolve_broker_url
from launcher.servers import S3_CREDENTIALS, S3Server, new_bucket
from launcher.stack import Stack

CHUNK = 1024 * 1024


def peak_rss_mib(pid: int) -> float:
    """VmHWM of the process or, for uvicorn's reloader-less single worker, the process itself."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def body(size_mib: int):
    block = b"\x08\x01" * (CHUNK // 2)  # protobuf-looking bytes; never a valid model
    for _ in range(size_mib):
        yield block


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,128,512", help="upload sizes in MiB, comma-separated")
    parser.add_argument("--store", choices=("local", "s3"), default="local", help="where uploads are stored")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    s3 = S3Server() if args.store == "s3" else None
    if s3 is not None:
        s3.start()
    try:
        return measure(sizes, s3)
    finally:
        if s3 is not None:
            s3.stop()


def measure(sizes: list[int], s3: S3Server | None) -> int:
    """Print the API's peak RSS after each upload of ``sizes`` MiB (into ``s3`` when given)."""
    with tempfile.TemporaryDirectory(prefix="bench-upload-") as var_dir:
        settings = Settings(var_dir=Path(var_dir))
        env = dict(
            os.environ,
            QUANT_VAR_DIR=var_dir,
            BROKER_URL=resolve_broker_url(settings),
            DATABASE_URL=settings.resolved_database_url,
            QUANT_MAX_MODEL_BYTES=str((max(sizes) + 1) * CHUNK),
        )
        if s3 is not None:
            bucket = new_bucket(s3.endpoint)
            env.update(S3_CREDENTIALS, QUANT_STORAGE_URL=f"s3://{bucket}/bench", QUANT_STORAGE_ENDPOINT_URL=s3.endpoint)
        stack = Stack(env=env, log_dir=Path(var_dir) / "logs")
        try:
            stack.migrate()
            stack.start_worker("default", "default")
            url = stack.start_api()
            key = subprocess.run(
                [sys.executable, "-m", "jobs.admin", "create-key", "--project", "bench"],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            api_pid = stack.processes["api"].pid
            print(f"{'upload MiB':>10}  {'status':>6}  {'API peak RSS MiB':>16}")
            print(f"{'(idle)':>10}  {'':>6}  {peak_rss_mib(api_pid):>16.1f}")
            for size in sizes:
                response = httpx.post(
                    f"{url}/api/v1/models",
                    params={"filename": "bench.onnx"},
                    content=body(size),
                    headers={"X-API-Key": key, "Content-Type": "application/octet-stream"},
                    timeout=600,
                )
                print(f"{size:>10}  {response.status_code:>6}  {peak_rss_mib(api_pid):>16.1f}")
        finally:
            stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
