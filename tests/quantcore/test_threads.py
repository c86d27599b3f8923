from __future__ import annotations

import pytest
import torch

from quantcore.threads import torch_threads


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
