"""Load on the whole service, on this machine, over loopback: request latency and no lost jobs.

    .venv/bin/python -m bench.load [--clients 16] [--rate 200] [--duration 60] [--jobs 1000]
                                   [--api-workers 2] [--job-workers 1] [--worker-nice 10]
                                   [--drain-timeout 1800]

Starts its own PostgreSQL cluster and Redis (throwaway, free ports; the shared servers are not
touched), migrates, and starts the API (uvicorn with `--api-workers` processes), a job worker
(`--job-workers` Celery processes on the `gpu` queue) and the default worker with beat. Then, for
`--duration` seconds, `--clients` concurrent clients, each on its own keep-alive connection, send
`--rate` requests per second in all (open loop: each client keeps its own schedule, so a slow answer
does not lower the offered load, and a request sent late is also timed from its scheduled time):
listing jobs (`GET /jobs?limit=20`), reading one (`GET /jobs/{id}`) and, spread evenly over the
duration, `--jobs` job submissions (`POST /jobs`). The jobs quantize a real tiny model
(Conv-Relu-Pool-Gemm, `samples.tiny.tiny_conv_model`) on 32 samples with a recipe that keeps
every stage short. Afterwards it waits up to `--drain-timeout` s for every submitted job to end.

Prints one Markdown table per operation (count, errors, throughput, p50/p99/max latency from sending
to the last byte of the response, p99 from the scheduled send time), the CPU the API processes and
this process spent per request, and the job outcome (succeeded / failed / canceled / still not
terminal = lost). Run with `nice`: the
machine is shared. API peak memory during a 1 GB upload is `bench/upload_memory.py --sizes 1024`.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import uvloop

from jobs.config import Settings
from launcher.servers import PostgresCluster, RedisServer
from launcher.stack import Stack
from samples.tiny import tiny_conv_bytes

FAST_RECIPE = {
    "calibration": {"observer": "minmax", "num_samples": 24, "batch_size": 8},
    "evaluation": {"holdout_fraction": 0.25, "max_samples": 8},
    "deploy": {"cpu_latency": False},
}
TERMINAL = {"succeeded", "failed", "canceled"}
API = "/api/v1"
TIMEOUT = 30.0  # seconds for one request, as before with httpx: a transport error past it


class Connection:
    """One keep-alive HTTP/1.1 connection, the client's side kept as cheap as possible: the
    benchmark shares the cores with the service, and a general-purpose client (httpx) spent 3.1 ms
    of CPU per request, two thirds of what the API spent (both measured by this benchmark). A request is written
    whole; its response is read whole (status line, headers, then exactly Content-Length bytes)."""

    def __init__(self, host: str, port: int, headers: dict[str, str]) -> None:
        self.host, self.port = host, port
        self.headers = "".join(f"{name}: {value}\r\n" for name, value in {"Host": host, **headers}.items())
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def request(self, method: str, target: str, body: bytes = b"") -> tuple[int, bytes]:
        if self.streams is None:
            self.streams = await asyncio.open_connection(self.host, self.port)
        reader, writer = self.streams
        extra = f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n" if body else ""
        writer.write(f"{method} {target} HTTP/1.1\r\n{self.headers}{extra}\r\n".encode() + body)
        try:
            async with asyncio.timeout(TIMEOUT):
                head = await reader.readuntil(b"\r\n\r\n")
                length = _CONTENT_LENGTH.search(head)
                if length is None:
                    raise ValueError("response without Content-Length")
                content = await reader.readexactly(int(length[1]))
        except BaseException:
            self.close()  # the connection's state is unknown: the next request opens a new one
            raise
        if _CLOSE.search(head):
            self.close()
        return int(head[9:12]), content

    def close(self) -> None:
        if self.streams is not None:
            self.streams[1].close()
            self.streams = None


_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length: *(\d+)", re.IGNORECASE)
_CLOSE = re.compile(rb"\r\nconnection: *close", re.IGNORECASE)


@dataclass
class Recorder:
    # Seconds, per operation: from sending the request to reading the last byte of the response, and
    # from the time the schedule said to send it (the same plus any wait for this client's connection:
    # coordinated omission, which the first figure alone would hide when the service falls behind).
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    from_schedule: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    job_ids: list[str] = field(default_factory=list)

    async def timed(
        self, name: str, scheduled: float, connection: Connection, method: str, target: str, body: bytes = b""
    ) -> tuple[int, bytes] | None:
        started = time.perf_counter()
        try:
            status, content = await connection.request(method, target, body)
        except (OSError, EOFError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            self.errors[name].append(type(exc).__name__)
            return None
        ended = time.perf_counter()
        self.latencies[name].append(ended - started)
        self.from_schedule[name].append(ended - scheduled)
        if status >= 400:
            self.errors[name].append(str(status))
        return status, content


async def client_loop(
    number: int, connection: Connection, recorder: Recorder, plan: list[tuple[float, str]], start: float, body: bytes
) -> None:
    """Send this client's share of the plan on its own connection, each request at its scheduled time
    (or at once, when the previous answer came later than that)."""
    rng = random.Random(number)
    for at, kind in plan:
        scheduled = start + at
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if kind == "submit":
            answer = await recorder.timed("POST /jobs", scheduled, connection, "POST", f"{API}/jobs", body)
            if answer is not None and answer[0] == 202:
                recorder.job_ids.append(json.loads(answer[1])["id"])
        elif kind == "list" or not recorder.job_ids:
            await recorder.timed("GET /jobs", scheduled, connection, "GET", f"{API}/jobs?limit=20")
        else:
            job_id = rng.choice(recorder.job_ids)
            await recorder.timed("GET /jobs/{id}", scheduled, connection, "GET", f"{API}/jobs/{job_id}")
    connection.close()


def make_plan(args: argparse.Namespace) -> list[list[tuple[float, str]]]:
    """Evenly spaced requests: `rate * duration` reads (half lists, half single reads) and `jobs`
    submissions, dealt round-robin to the clients."""
    events = []
    reads = int(args.rate * args.duration)
    for i in range(reads):
        events.append((i / args.rate, "list" if i % 2 == 0 else "read"))
    for i in range(args.jobs):
        events.append((i * args.duration / max(args.jobs, 1), "submit"))
    events.sort()
    plans: list[list[tuple[float, str]]] = [[] for _ in range(args.clients)]
    for i, event in enumerate(events):
        plans[i % args.clients].append(event)
    return plans


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]  # nearest rank


def print_table(recorder: Recorder, wall: float) -> None:
    print(
        "| operation | requests | errors | throughput (req/s) | p50 (ms) | p99 (ms) | max (ms) "
        "| p99 from schedule (ms) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    names = sorted(set(recorder.latencies) | set(recorder.errors))
    every: list[float] = []
    every_scheduled: list[float] = []
    for name in names:
        values, scheduled = recorder.latencies[name], recorder.from_schedule[name]
        if name.startswith("GET"):
            every += values
            every_scheduled += scheduled
        count = len(values) + sum(1 for e in recorder.errors[name] if not e.isdigit())
        row = [f"{percentile(values, q) * 1000:.1f}" for q in (0.5, 0.99, 1.0)] if values else ["-"] * 3
        row.append(f"{percentile(scheduled, 0.99) * 1000:.1f}" if scheduled else "-")
        print(f"| {name} | {count} | {len(recorder.errors[name])} | {count / wall:.1f} | {' | '.join(row)} |")
    if every:
        row = [f"{percentile(every, q) * 1000:.1f}" for q in (0.5, 0.99, 1.0)]
        row.append(f"{percentile(every_scheduled, 0.99) * 1000:.1f}")
        print(f"| all GETs | {len(every)} | - | {len(every) / wall:.1f} | {' | '.join(row)} |")
    for name, errors in recorder.errors.items():
        if errors:
            kinds = defaultdict(int)
            for error in errors:
                kinds[error] += 1
            print(f"errors on {name}: {dict(kinds)}", file=sys.stderr)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and all its descendants (Linux /proc), in seconds."""
    total, stack = 0.0, [pid]
    while stack:
        current = stack.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rpartition(")")[2].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
            for task in Path(f"/proc/{current}/task").iterdir():
                stack += [int(child) for child in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


ACCESS_LINE = re.compile(rb" api\.access \[(\d+)\] (GET|POST) /api/v1/jobs(/[0-9a-f-]+)? (\d{3}) ([\d.]+) ms")


@dataclass
class ServerLog:
    """What the API's access log says of the job requests: seconds per operation, timed from the ASGI
    app receiving the request to its last byte sent (no socket, no kernel queue, no client), and the
    number each API process served."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    by_process: dict[int, int] = field(default_factory=lambda: defaultdict(int))

    @classmethod
    def read(cls, log: Path, offset: int) -> ServerLog:
        """The lines from byte `offset` on."""
        found = cls()
        with log.open("rb") as lines:
            lines.seek(offset)
            for line in lines:
                if match := ACCESS_LINE.search(line):
                    pid, method, one, _status, ms = match.groups()
                    found.latencies[f"{method.decode()} /jobs{'/{id}' if one else ''}"].append(float(ms) / 1000)
                    found.by_process[int(pid)] += 1
        return found

    def print(self) -> None:
        print("\nIn the API (access log):\n")
        print("| operation | requests | p50 (ms) | p99 (ms) | max (ms) |")
        print("| --- | ---: | ---: | ---: | ---: |")
        every = [v for name, values in self.latencies.items() if name.startswith("GET") for v in values]
        for name, values in [*sorted(self.latencies.items()), ("all GETs", every)]:
            if values:
                row = " | ".join(f"{percentile(values, q) * 1000:.1f}" for q in (0.5, 0.99, 1.0))
                print(f"| {name} | {len(values)} | {row} |")
        shares = ", ".join(f"{count}" for count in sorted(self.by_process.values(), reverse=True))
        print(f"\njob requests served per API process: {shares}")


def component_pids(stack: Stack, postgres: PostgresCluster, broker: RedisServer) -> dict[str, int]:
    """The root process of each part of the stack; `cpu_seconds` adds its descendants."""
    assert postgres.data is not None and broker.process is not None
    pids = {name: process.pid for name, process in stack.processes.items()}
    pids["postgresql"] = int((postgres.data / "db" / "postmaster.pid").read_text().split()[0])
    pids["redis"] = broker.process.pid
    return pids


def upload_inputs(url: str, key: str) -> dict:
    rng = np.random.default_rng(0)
    buffer = io.BytesIO()
    np.savez(buffer, image=rng.normal(size=(32, 3, 8, 8)).astype(np.float32))
    with httpx.Client(base_url=f"{url}/api/v1", headers={"X-API-Key": key}, timeout=120) as client:
        model = client.post("/models", files={"file": ("tiny.onnx", tiny_conv_bytes())})
        model.raise_for_status()
        dataset = client.post("/datasets", files={"file": ("tiny.npz", buffer.getvalue())})
        dataset.raise_for_status()
        model_id = model.json()["id"]
        deadline = time.monotonic() + 60
        while client.get(f"/models/{model_id}").json()["status"] == "pending":
            if time.monotonic() > deadline:
                raise TimeoutError("the model was not validated within 60 s")
            time.sleep(0.2)
    return {"model_id": model_id, "dataset_id": dataset.json()["id"], "recipe": FAST_RECIPE}


def drain(url: str, key: str, job_ids: list[str], timeout: float) -> tuple[dict[str, int], float]:
    """Wait until every job is terminal (or the timeout); returns the count per status and the wait."""
    started = time.monotonic()
    pending = set(job_ids)
    statuses: dict[str, str] = {}
    with httpx.Client(base_url=f"{url}/api/v1", headers={"X-API-Key": key}, timeout=60) as client:
        while pending and time.monotonic() - started < timeout:
            cursor = None
            while True:  # one pass over the listing is far cheaper than one GET per job
                params = {"limit": 200, **({"cursor": cursor} if cursor else {})}
                page = client.get("/jobs", params=params).json()
                for job in page["items"]:
                    statuses[job["id"]] = job["status"]
                cursor = page.get("next_cursor")
                if not cursor:
                    break
            pending = {j for j in pending if statuses.get(j) not in TERMINAL}
            if pending:
                time.sleep(2.0)
    counts: dict[str, int] = defaultdict(int)
    for job_id in job_ids:
        status = statuses.get(job_id, "missing")
        counts[status if status in TERMINAL else "not terminal (lost)"] += 1
    return dict(counts), time.monotonic() - started


async def run_load(args: argparse.Namespace, url: str, key: str, body: dict) -> tuple[Recorder, float]:
    recorder = Recorder()
    address = httpx.URL(url)
    payload = json.dumps(body).encode()
    connections = [Connection(address.host, address.port, {"X-API-Key": key}) for _ in range(args.clients)]
    start = time.perf_counter() + 0.5
    plans = make_plan(args)
    await asyncio.gather(
        *(client_loop(i, connections[i], recorder, plan, start, payload) for i, plan in enumerate(plans))
    )
    return recorder, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--rate", type=float, default=200.0, help="GET requests per second, all clients together")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    parser.add_argument("--jobs", type=int, default=1000, help="jobs submitted, spread over the duration")
    parser.add_argument("--api-workers", type=int, default=2)
    parser.add_argument("--job-workers", type=int, default=1, help="Celery processes on the job queue")
    parser.add_argument(
        "--worker-nice",
        type=int,
        default=Settings.model_fields["worker_nice"].default,
        help="QUANT_WORKER_NICE of the workers: the niceness they add to their own when they start, so that "
        "jobs sharing the API's host yield the CPU to it (0: the API's priority)",
    )
    parser.add_argument("--drain-timeout", type=float, default=1800.0, help="seconds to wait for jobs to end")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # the table appears while the jobs drain
    if reason := PostgresCluster.unavailable_reason():
        print(f"cannot start PostgreSQL: {reason}", file=sys.stderr)
        return 2

    postgres, broker = PostgresCluster(), RedisServer()
    with tempfile.TemporaryDirectory(prefix="bench-load-") as var_dir:
        stack = None
        try:
            postgres.init()
            postgres.start()
            broker.start()
            env = dict(
                os.environ,
                DATABASE_URL=postgres.url,
                BROKER_URL=broker.url,
                QUANT_VAR_DIR=var_dir,
                QUANT_ENVIRONMENT="test",
                # The benchmark measures throughput and loss, not the per-project quota: every job may queue.
                QUANT_QUOTA_CONCURRENT_JOBS=str(max(args.jobs, 1)),
                QUANT_WORKER_NICE=str(args.worker_nice),
            )
            stack = Stack(env=env, log_dir=Path(var_dir) / "logs")
            stack.migrate()
            stack.start_worker("default", "default", beat=True)
            stack.start_worker("gpu", "gpu", concurrency=args.job_workers)
            url = stack.start_api(workers=args.api_workers)
            key = _create_key(env)
            body = upload_inputs(url, key)
            print(
                f"load: {args.clients} clients, {args.rate:g} GET/s, {args.jobs} jobs over {args.duration:g} s; "
                f"API {args.api_workers} uvicorn workers, {args.job_workers} job worker process(es) "
                f"(workers at nice +{args.worker_nice}); PostgreSQL {postgres.port}, Redis {broker.port}",
                file=sys.stderr,
            )
            api_log = Path(var_dir) / "logs" / "api.log"
            log_offset = api_log.stat().st_size
            pids = component_pids(stack, postgres, broker)
            parts_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            own_before = time.process_time()
            recorder, wall = uvloop.run(run_load(args, url, key, body))
            own_cpu = time.process_time() - own_before
            parts = {name: cpu_seconds(pid) - parts_before[name] for name, pid in pids.items()}
            api_cpu = parts["api"]
            requests = sum(len(v) for v in recorder.latencies.values())
            print(f"\n{wall:.1f} s of load (scheduled: {args.duration:g} s); load average {os.getloadavg()[0]:.1f}\n")
            print_table(recorder, wall)
            ServerLog.read(api_log, log_offset).print()
            print("\nCPU during the load, by part of the stack (s, and cores' worth over the load's wall time):\n")
            print("| " + " | ".join([*parts, "load generator"]) + " |")
            print("| " + " | ".join("---:" for _ in range(len(parts) + 1)) + " |")
            print("| " + " | ".join(f"{cpu:.1f} s ({cpu / wall:.2f})" for cpu in [*parts.values(), own_cpu]) + " |")
            print(
                f"\nAPI CPU (uvicorn master + workers): {api_cpu:.1f} s, {1000 * api_cpu / max(requests, 1):.2f} ms "
                f"per request: about {requests / api_cpu if api_cpu else 0:.0f} requests/s per free core"
            )
            print(
                f"load generator CPU (this process): {own_cpu:.1f} s, "
                f"{1000 * own_cpu / max(requests, 1):.2f} ms per request"
            )
            counts, waited = drain(url, key, recorder.job_ids, args.drain_timeout)
            print(f"\njobs accepted: {len(recorder.job_ids)} of {args.jobs} submitted")
            print(f"job outcomes: {counts}; the last ended {waited:.0f} s after the load")
            print(f"job throughput: {len(recorder.job_ids) / (wall + waited):.2f} jobs/s end to end")
            lost = counts.get("not terminal (lost)", 0)
            return 0 if lost == 0 and not any(recorder.errors.values()) else 1
        finally:
            if stack is not None:
                stack.stop()
            broker.kill()
            postgres.destroy()


def _create_key(env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "jobs.admin", "create-key", "--project", "bench", "--name", "load"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    return done.stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
