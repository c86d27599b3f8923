"""Load on the whole service, on this machine, over loopback: request latency and no lost jobs.

    .venv/bin/python -m bench.load [--clients 16] [--rate 200] [--duration 60] [--jobs 1000]
                                   [--api-workers 2] [--job-workers 1] [--drain-timeout 1800]

Starts its own PostgreSQL cluster and Redis (throwaway, free ports; the shared servers are not
touched), migrates, and starts the API (uvicorn with `--api-workers` processes), a job worker
(`--job-workers` Celery processes on the `gpu` queue) and the default worker with beat. Then, for
`--duration` seconds, `--clients` concurrent clients send `--rate` requests per second in all
(open loop: each client keeps its own schedule, so a slow answer does not lower the offered load):
listing jobs (`GET /jobs?limit=20`), reading one (`GET /jobs/{id}`) and, spread evenly over the
duration, `--jobs` job submissions (`POST /jobs`). The jobs quantize a real tiny model
(Conv-Relu-Pool-Gemm, `tests.onnx_builders.tiny_conv_model`) on 32 samples with a recipe that keeps
every stage short. Afterwards it waits up to `--drain-timeout` s for every submitted job to end.

Prints one Markdown table per operation (count, errors, throughput, p50/p99/max latency) and the
job outcome (succeeded / failed / canceled / still not terminal = lost). Run with `nice`: the
machine is shared. API peak memory during a 1 GB upload is `bench/upload_memory.py --sizes 1024`.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from launcher.servers import PostgresCluster, RedisServer
from launcher.stack import Stack
from tests.onnx_builders import tiny_conv_bytes

FAST_RECIPE = {
    "calibration": {"observer": "minmax", "num_samples": 24, "batch_size": 8},
    "evaluation": {"holdout_fraction": 0.25, "max_samples": 8},
    "deploy": {"cpu_latency": False},
}
TERMINAL = {"succeeded", "failed", "canceled"}


@dataclass
class Recorder:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))  # seconds
    errors: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    job_ids: list[str] = field(default_factory=list)

    async def timed(self, name: str, request) -> httpx.Response | None:
        started = time.perf_counter()
        try:
            response = await request
        except httpx.HTTPError as exc:
            self.errors[name].append(type(exc).__name__)
            return None
        self.latencies[name].append(time.perf_counter() - started)
        if response.status_code >= 400:
            self.errors[name].append(str(response.status_code))
        return response


async def client_loop(
    number: int, api: httpx.AsyncClient, recorder: Recorder, plan: list[tuple[float, str]], start: float, body: dict
) -> None:
    """Send this client's share of the plan, each request at its scheduled time."""
    rng = random.Random(number)
    for at, kind in plan:
        delay = start + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if kind == "submit":
            response = await recorder.timed("POST /jobs", api.post("/jobs", json=body))
            if response is not None and response.status_code == 202:
                recorder.job_ids.append(response.json()["id"])
        elif kind == "list" or not recorder.job_ids:
            await recorder.timed("GET /jobs", api.get("/jobs", params={"limit": 20}))
        else:
            job_id = rng.choice(recorder.job_ids)
            await recorder.timed("GET /jobs/{id}", api.get(f"/jobs/{job_id}"))


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
    print("| operation | requests | errors | throughput (req/s) | p50 (ms) | p99 (ms) | max (ms) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    names = sorted(set(recorder.latencies) | set(recorder.errors))
    every: list[float] = []
    for name in names:
        values = recorder.latencies[name]
        every += values if name.startswith("GET") else []
        count = len(values) + sum(1 for e in recorder.errors[name] if not e.isdigit())
        row = [f"{percentile(values, q) * 1000:.1f}" for q in (0.5, 0.99, 1.0)] if values else ["-"] * 3
        print(f"| {name} | {count} | {len(recorder.errors[name])} | {count / wall:.1f} | {' | '.join(row)} |")
    if every:
        row = [f"{percentile(every, q) * 1000:.1f}" for q in (0.5, 0.99, 1.0)]
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
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(
        base_url=f"{url}/api/v1", headers={"X-API-Key": key}, timeout=30, limits=limits
    ) as api:
        start = time.monotonic() + 0.5
        plans = make_plan(args)
        await asyncio.gather(*(client_loop(i, api, recorder, plan, start, body) for i, plan in enumerate(plans)))
        wall = time.monotonic() - start
    return recorder, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--rate", type=float, default=200.0, help="GET requests per second, all clients together")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    parser.add_argument("--jobs", type=int, default=1000, help="jobs submitted, spread over the duration")
    parser.add_argument("--api-workers", type=int, default=2)
    parser.add_argument("--job-workers", type=int, default=1, help="Celery processes on the job queue")
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
                f"API {args.api_workers} uvicorn workers, {args.job_workers} job worker process(es); "
                f"PostgreSQL {postgres.port}, Redis {broker.port}",
                file=sys.stderr,
            )
            api_pid = stack.processes["api"].pid
            cpu_before = cpu_seconds(api_pid)
            recorder, wall = asyncio.run(run_load(args, url, key, body))
            api_cpu = cpu_seconds(api_pid) - cpu_before
            requests = sum(len(v) for v in recorder.latencies.values())
            print(f"\n{wall:.1f} s of load (scheduled: {args.duration:g} s); load average {os.getloadavg()[0]:.1f}\n")
            print_table(recorder, wall)
            print(
                f"\nAPI CPU (uvicorn master + workers): {api_cpu:.1f} s, {1000 * api_cpu / max(requests, 1):.2f} ms "
                f"per request: about {requests / api_cpu if api_cpu else 0:.0f} requests/s per free core"
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
