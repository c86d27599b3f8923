"""CPU per request of the read path, in process: where the API's time goes, without the network.

    .venv/bin/python -m bench.request_cpu [--requests 2000] [--rounds 3] [--jobs 20] [--profile] [--top 40]

Starts a throwaway PostgreSQL cluster (as `bench.load` does), migrates it, creates one project with a
key and `--jobs` jobs, and calls the ASGI application (`api.main.create_app`) directly, one request
after another, with the scope, receive and send a server would give it: no socket, no HTTP parser,
no client. Every layer of the API runs as served (request id, access log to /dev/null in the text
format, body cap, key lookup with its `last_used_at` bookkeeping, session, query, serialization).

Prints, per operation, the process CPU time (all threads) and the wall time per request, from the
round (of `--rounds`) that took the least CPU: on a shared machine the others are slowed by neighbours.
Then the CPU of the app's warm-up (`api.warmup`) and of the first request after it, both measured
before any other request, and what a full garbage collection costs before and after `gc.freeze()`. With
`--profile` it also prints a cProfile of the same loop, with FastAPI's thread-pool hops run inline so
that the profiler (which sees one thread) sees the sync dependencies and routes; the CPU figures
are always taken without the profiler, with the real thread pool.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import logging
import os
import pstats
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio.to_thread

from api.warmup import asgi_get, warm_up
from launcher.servers import PostgresCluster
from launcher.stack import Stack
from samples.rows import placeholder_job

Call = Callable[[], Any]


def build(database_url: str, jobs: int) -> tuple[Any, str, str]:
    """The app, a key, and one job id of the key's project."""
    from api.main import create_app
    from jobs import keys, queries
    from jobs.config import Settings
    from jobs.db import session_scope
    from jobs.logs import configure_logging

    settings = Settings(database_url=database_url, environment="test", broker_url="redis://127.0.0.1:1/0")
    with session_scope(database_url) as session:
        project = queries.create_project(session=session, name="bench")
        _row, key = keys.create_api_key(session=session, project_id=project.id)
        job_ids = placeholder_job(
            session=session,
            project_id=project.id,
            recipe={"calibration": {"observer": "minmax", "num_samples": 24}},
            count=max(jobs, 1),
        )
    configure_logging(settings)  # as the served app's lifespan does; the lines go to /dev/null
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(open(os.devnull, "w"))  # noqa: SIM115 (lives as long as the process)
    return create_app(settings), key, str(job_ids[0])


async def run(app: Any, key: str, job_id: str, operation: str, count: int) -> None:
    path, query = {
        "GET /health": ("/api/v1/health", b""),
        "GET /jobs": ("/api/v1/jobs", b"limit=20"),
        "GET /jobs/{id}": (f"/api/v1/jobs/{job_id}", b""),
    }[operation]
    for _ in range(count):
        status = await asgi_get(app, path, query, [(b"x-api-key", key.encode())])
        if status != 200:
            raise RuntimeError(f"{operation} answered {status}")


@contextmanager
def threadpool_inline():
    """Run `anyio.to_thread.run_sync` calls in the calling thread, so cProfile sees them."""
    real = anyio.to_thread.run_sync

    async def inline(func, *args, **_kwargs):
        return func(*args)

    anyio.to_thread.run_sync = inline
    try:
        yield
    finally:
        anyio.to_thread.run_sync = real


def collection_cpu_ms() -> float:
    """CPU ms of one full cyclic garbage collection (the least of 3)."""
    spent = []
    for _ in range(3):
        started = time.thread_time()
        gc.collect()
        spent.append(time.thread_time() - started)
    return 1000 * min(spent)


def warm_up_cost(app: Any, key: str, job_id: str) -> str:
    """On the app this process has just built, before any other request: the CPU of `api.warmup`'s
    requests (what a cold app's first request would otherwise pay: lazy imports, first-use set-up), and
    of the first GET /jobs after them (its first database connection and statements)."""
    started = time.process_time()
    statuses = asyncio.run(warm_up(app))
    warmed = time.process_time()
    asyncio.run(run(app, key, job_id, "GET /jobs", 1))
    first = time.process_time()
    return (
        f"warm-up {statuses}: {1000 * (warmed - started):.1f} ms CPU; the first GET /jobs after it: "
        f"{1000 * (first - warmed):.1f} ms CPU"
    )


def print_collection_cost(app: Any, key: str, job_id: str, operations: tuple[str, ...], requests: int) -> None:
    """What a full collection costs a worker that has served requests, before and after `gc.freeze()`
    (`api.serve` freezes once the app is built): after freezing, `requests` more of each operation, and
    a full collection then scans what they left. Counted in this process, which holds the bench's own
    modules as well as the app's."""
    tracked, spent = len(gc.get_objects()), collection_cpu_ms()
    gc.freeze()
    for operation in operations:
        asyncio.run(run(app, key, job_id, operation, requests))
    print(
        f"\nfull garbage collection: {tracked} objects tracked, {spent:.1f} ms CPU; after gc.freeze() and "
        f"{requests} more of each request: {len(gc.get_objects())} tracked, {collection_cpu_ms():.2f} ms CPU"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per operation")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per operation; the least CPU is shown")
    parser.add_argument("--jobs", type=int, default=20, help="jobs in the project (GET /jobs lists 20)")
    parser.add_argument("--profile", action="store_true", help="also print a cProfile of the loop")
    parser.add_argument("--top", type=int, default=40, help="rows of the profile")
    args = parser.parse_args()
    if reason := PostgresCluster.unavailable_reason():
        print(f"cannot start PostgreSQL: {reason}", file=sys.stderr)
        return 2
    postgres = PostgresCluster()
    try:
        postgres.init()
        postgres.start()
        Stack(env=dict(os.environ, DATABASE_URL=postgres.url), log_dir=Path("/tmp")).migrate()
        app, key, job_id = build(postgres.url, args.jobs)
        first_requests = warm_up_cost(app, key, job_id)
        operations = ("GET /health", "GET /jobs", "GET /jobs/{id}")
        print("| operation | requests | CPU ms/request | wall ms/request |")
        print("| --- | ---: | ---: | ---: |")
        for operation in operations:
            asyncio.run(run(app, key, job_id, operation, 200))  # warm-up: pool, caches, first-call imports
            rounds = []
            for _ in range(args.rounds):
                cpu, wall = time.process_time(), time.perf_counter()
                asyncio.run(run(app, key, job_id, operation, args.requests))
                rounds.append((time.process_time() - cpu, time.perf_counter() - wall))
            cpu, wall = min(rounds)  # the round least disturbed by the machine's other processes
            print(
                f"| {operation} | {args.requests} | {1000 * cpu / args.requests:.3f} | "
                f"{1000 * wall / args.requests:.3f} |"
            )
        print(f"\n{first_requests}")
        print_collection_cost(app, key, job_id, operations, args.requests)
        if args.profile:
            for operation in operations:
                profile = cProfile.Profile(time.process_time)  # CPU, not time spent waiting for the database
                with threadpool_inline():
                    profile.runcall(asyncio.run, run(app, key, job_id, operation, args.requests))
                print(f"\n## {operation}: {args.requests} requests, cumulative time\n")
                pstats.Stats(profile).sort_stats("cumulative").print_stats(args.top)
                print(f"\n## {operation}: own time\n")
                pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)
        return 0
    finally:
        postgres.destroy()


if __name__ == "__main__":
    sys.exit(main())
