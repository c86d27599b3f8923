"""POST /jobs' dataset-vs-model check (`jobs.dataset_fit`) on what the service stores: the model info the
worker's validation records (`quantcore.inspect_model`) and the array headers read at upload
(`jobs.npz`). No services needed; tests/test_batch_axes.py runs the same through the real ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from jobs.config import Settings
from jobs.dataset_fit import LEGACY, dataset_mismatches
from jobs.npz import InvalidArchive, inspect_npz, npz_limits
from quantcore import inspect_model
from samples.tiny import stateful_data, stateful_model
from tests.quantcore.models import save


@pytest.fixture(scope="module")
def info(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return inspect_model(save(stateful_model(state_size=16), tmp_path_factory.mktemp("m") / "stateful.onnx"))


def _arrays(tmp_path: Path, **arrays: np.ndarray) -> tuple[list[dict], int | None]:
    np.savez(tmp_path / "d.npz", **arrays)
    listing = inspect_npz(tmp_path / "d.npz", limits=npz_limits(Settings(max_dataset_arrays=16)))
    return listing.arrays, listing.num_samples


def test_a_dataset_batched_along_each_inputs_axis_fits(info: dict, tmp_path: Path) -> None:
    data = stateful_data(40, seed=0, state_size=16)
    arrays, num_samples = _arrays(tmp_path, **data, labels=np.arange(40))
    assert num_samples is None  # x (40, 16), state (2, 40, 16): no common first axis at upload
    assert dataset_mismatches(info, arrays) == []


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        ({"state": np.zeros((40, 2, 16), np.float32)}, ["input 'state' axis 0 must be 2", "samples on axis 1"]),
        ({"state": np.zeros((2, 30, 16), np.float32)}, ["'x' axis 0: 40", "'state' axis 1: 30"]),
        ({"sr": np.full(40, 0.5, np.float32)}, ["input 'sr' expects rank 0", "a constant input"]),
        ({"labels": np.arange(39)}, ["'labels' must hold one integer per sample, shape [40]"]),
        (
            {"x": np.zeros((1, 16), np.float32), "state": np.zeros((2, 1, 16), np.float32), "labels": np.arange(1)},
            ["the dataset has 1 sample(s)", "at least 2"],
        ),
    ],
    ids=["samples-first-state", "counts-disagree", "sr-per-sample", "labels", "one-sample"],
)
def test_mismatches_name_the_input_and_axis(info: dict, tmp_path: Path, change: dict, needles: list[str]) -> None:
    data = {**stateful_data(40, seed=0, state_size=16), "labels": np.arange(40), **change}
    problems = dataset_mismatches(info, _arrays(tmp_path, **data)[0])
    assert len(problems) == 1 and all(needle in problems[0] for needle in needles), problems


def test_models_recorded_before_batch_axes_count_on_axis_0(info: dict, tmp_path: Path) -> None:
    legacy = {**info, "inputs": [{k: v for k, v in i.items() if k != "batch_axis"} for i in info["inputs"]]}
    problems = dataset_mismatches(legacy, _arrays(tmp_path, **stateful_data(40, seed=0, state_size=16))[0])
    # as the service assumed before it recorded batch axes: such a row needs its model validated again
    assert problems == [
        "inputs disagree on the number of samples, counted along each input's batch axis ('x' axis 0: 40, "
        "'state' axis 0: 2)",
        LEGACY,
    ]


def test_upload_counts_samples_only_when_the_arrays_share_a_first_axis(tmp_path: Path) -> None:
    assert _arrays(tmp_path, a=np.zeros((4, 2)), b=np.zeros(4))[1] == 4
    assert _arrays(tmp_path, a=np.zeros((4, 2)), b=np.zeros((5, 2)))[1] is None
    assert _arrays(tmp_path, a=np.zeros((4, 2)), rate=np.array(16000))[1] == 4  # a scalar holds no samples
    with pytest.raises(InvalidArchive, match="every array is a scalar"):
        _arrays(tmp_path, rate=np.array(16000))
