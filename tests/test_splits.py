"""The worker's calibration/evaluation split: samples taken along each model input's batch axis, the
same rule quantcore batches with (no services needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from jobs.recipe import Recipe
from quantcore.errors import InvalidDataError
from quantcore.runtime.batching import input_specs
from samples.tiny import stateful_data, stateful_model
from worker.splits import split_dataset, split_indices

AXES = {spec.name: spec.batch_axis for spec in input_specs(stateful_model(state_size=16))}


def _npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def test_the_rule_is_quantcores() -> None:
    assert AXES == {"x": 0, "state": 1, "sr": None}


def test_split_takes_samples_along_each_inputs_batch_axis(tmp_path) -> None:
    data = stateful_data(40, seed=0, state_size=16)
    labels = np.arange(40) % 4
    recipe = Recipe(seed=7, evaluation={"holdout_fraction": 0.25})
    split = split_dataset(_npz(tmp_path / "d.npz", **data, labels=labels), AXES, recipe)
    calibration, evaluation = split_indices(40, recipe)
    assert (len(calibration), len(evaluation)) == (30, 10)  # 40 samples counted on x axis 0 = state axis 1
    assert split.calibration_indices == calibration.tolist() and split.evaluation_indices == evaluation.tolist()
    # exact: the parts are the chosen samples themselves, no arithmetic
    np.testing.assert_array_equal(split.calibration["state"], data["state"][:, calibration])
    np.testing.assert_array_equal(split.evaluation["state"], data["state"][:, evaluation])
    np.testing.assert_array_equal(split.calibration["x"], data["x"][calibration])
    np.testing.assert_array_equal(split.evaluation["x"], data["x"][evaluation])
    np.testing.assert_array_equal(split.labels, labels[evaluation])
    np.testing.assert_array_equal(split.calibration_labels, labels[calibration])  # QAT's label loss reads them
    assert split.calibration["sr"].shape == split.evaluation["sr"].shape == () == data["sr"].shape  # whole, twice
    record = split.record
    assert record["num_samples"] == 40 and record["batch_axes"] == {"x": 0, "state": 1, "sr": None}
    assert (record["calibration"]["count"], record["evaluation"]["count"]) == (30, 10)
    assert record["label_source"] == "npz array 'labels'"
    again = split_dataset(tmp_path / "d.npz", AXES, recipe)  # seeded: the same split again
    assert again.record == record


def test_split_refuses_samples_that_disagree_naming_input_and_axis(tmp_path) -> None:
    data = stateful_data(40, seed=0, state_size=16)
    recipe = Recipe()
    short_state = {**data, "state": data["state"][:, :30]}
    with pytest.raises(InvalidDataError, match=r"'x' axis 0: 40, 'state' axis 1: 30"):
        split_dataset(_npz(tmp_path / "a.npz", **short_state), AXES, recipe)
    with pytest.raises(InvalidDataError, match=r"'labels'.*one label per sample \(40\)"):
        split_dataset(_npz(tmp_path / "b.npz", **data, labels=np.zeros(39, np.int64)), AXES, recipe)
    with pytest.raises(InvalidDataError, match=r"no array for model input 'sr'"):
        split_dataset(_npz(tmp_path / "c.npz", x=data["x"], state=data["state"]), AXES, recipe)
