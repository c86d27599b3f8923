"""Fixtures shared by quantcore's tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from samples.digits import TRAIN_SAMPLES
from tests.quantcore.auto_cases import heavy_tailed, progress, recorded_runs, small  # noqa: F401 (fixtures of the auto tests)


@dataclass(frozen=True)
class Digits:
    model_path: Path
    images: np.ndarray  # (1797, 1, 8, 8) float32
    labels: np.ndarray  # (1797,) int64

    @property
    def calibration(self) -> dict[str, np.ndarray]:
        return {"input": self.images[:256]}  # training samples, as calibration data usually is

    @property
    def evaluation(self) -> dict[str, np.ndarray]:
        return {"input": self.images[TRAIN_SAMPLES:]}  # the 500 held-out samples

    @property
    def evaluation_labels(self) -> np.ndarray:
        return self.labels[TRAIN_SAMPLES:]


@pytest.fixture(scope="session")
def digits_sample(digits: tuple[Path, Path]) -> Digits:
    """The sample CNN and its data, trained once per test session (about 6 s) by the suite-wide
    ``digits`` fixture of tests/conftest.py, i.e. ``samples.digits.build_digits(dir)``."""
    model_path, data_path = digits
    data = np.load(data_path)
    return Digits(model_path=model_path, images=data["input"], labels=data["labels"])


@pytest.fixture(scope="session")
def digits_mobilenet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``samples.trained.DigitsMobileNet`` trained on the digits (about 5 s), its ReLU6 exported as
    Clip; its data is ``samples.digits.load_dataset(0)``."""
    from samples.trained import build_mobilenet

    return build_mobilenet(tmp_path_factory.mktemp("digits-mobilenet"))
