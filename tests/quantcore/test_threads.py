from __future__ import annotations

from unittest.mock import patch

import numpy as np
import pytest
import torch

from quantcore.numerics.tqc import TensorQuantConfig
from quantcore.observers import clipping
from quantcore.observers.registry import make_observer
from quantcore.runtime.threads import torch_threads


def test_torch_threads_sets_the_count_for_the_block_and_restores_it_even_when_the_block_raises() -> None:
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(RuntimeError, match="inside"), torch_threads(1):
            assert torch.get_num_threads() == 1
            raise RuntimeError("inside")
        assert torch.get_num_threads() == 2
        with torch_threads(0):  # 0: unchanged
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)


def test_the_mse_search_runs_on_one_torch_thread_and_gives_the_callers_count_back() -> None:
    """Its tensors are small: split over two threads they cost more CPU than they save
    (``clipping.SEARCH_THREADS``)."""
    observer = make_observer(TensorQuantConfig(num_bits=8, observer="mse"))
    observer.observe(np.random.default_rng(3).standard_t(3, size=20_000).astype(np.float32))
    threads_seen = []
    search = clipping._mse_losses

    def recording(*args: object) -> np.ndarray:
        threads_seen.append(torch.get_num_threads())
        return search(*args)

    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with patch("quantcore.observers.clipping._mse_losses", recording):
            observer.bounds()
        assert threads_seen == [1, 1]  # the coarse and the fine search
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)
