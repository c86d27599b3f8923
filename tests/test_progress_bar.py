"""The job's overall progress bar (worker.runner): every stage of the pipeline has its share, in order."""

from __future__ import annotations

import pytest

import quantcore
from worker.runner import STAGE_WEIGHTS, stage_weights


@pytest.mark.parametrize("strategy", ["fixed", "auto"])
def test_every_stage_of_the_pipeline_has_a_share_of_the_bar_in_its_order(strategy: str) -> None:
    """A stage without a share reports overall progress 0, and the bar steps back while it runs."""
    weights = stage_weights(strategy)
    between = [stage for stage in weights if stage not in ("load", "store")]
    assert between == [stage for stage in quantcore.STAGES if stage != "auto" or strategy == "auto"]
    assert sum(weights.values()) == pytest.approx(1.0, abs=1e-9)
    assert set(STAGE_WEIGHTS) | {"auto"} == set(weights) | {"auto"}
