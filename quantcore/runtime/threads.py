"""torch's intra-op thread count, set for a block of work and restored after it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op thread count set to ``threads`` (0: unchanged) for the block, then restored. The
    count is the process's: blocks on two threads at once would restore each other's."""
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
