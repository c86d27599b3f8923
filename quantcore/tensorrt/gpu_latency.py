"""GPU latency with CUDA events: the device time of one enqueued inference, not host overhead.

``launch()`` enqueues one inference on torch's current CUDA stream (for TensorRT:
``context.execute_async_v3(stream)`` with buffers already bound, called inside
``torch.cuda.stream(stream)`` so the events bracket the same, non-default, stream). Protocol: ``warmup`` launches and a
device synchronize, then per timed run an event before and after the launch on the same stream;
``elapsed_time`` gives ms. The summary is ``quantcore.evaluate.cpu_latency.summarize`` (p50/p90/p99,
throughput = batch · runs / Σ t) plus ``"timer": "cuda-events"``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from quantcore.evaluate.cpu_latency import summarize


def cuda_event_times(launch: Callable[[], None], *, warmup: int, runs: int) -> list[float]:
    """Device ms of ``runs`` launches, each bracketed by CUDA events on the current stream."""
    stream = torch.cuda.current_stream()
    for _ in range(warmup):
        launch()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        launch()
        end.record(stream)
        end.synchronize()
        times.append(float(start.elapsed_time(end)))
    return times


def gpu_latency(launch: Callable[[], None], batch: int, *, warmup: int, runs: int) -> dict[str, Any]:
    return {**summarize(cuda_event_times(launch, warmup=warmup, runs=runs), batch), "timer": "cuda-events"}
