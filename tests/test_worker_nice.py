"""A Celery worker lowers its CPU priority as it starts (`QUANT_WORKER_NICE`), before its pool forks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jobs.config import Settings

# Fires the signal a starting worker sends (celery.worker.WorkController, before the pool starts) in a
# fresh interpreter, so the niceness of the test process itself is left alone.
_START = (
    "import os; from celery.signals import worker_init; import worker.app; "
    "worker_init.send(sender=None); print(os.nice(0))"
)


def _niceness_after_start(env: dict[str, str]) -> int:
    done = subprocess.run([sys.executable, "-c", _START], env=env, capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1])


@pytest.mark.parametrize("increment", [0, 3])
def test_worker_adds_its_setting_to_the_niceness_it_started_with(increment: int) -> None:
    env = {k: v for k, v in os.environ.items() if k != "QUANT_WORKER_NICE"}
    env["QUANT_WORKER_NICE"] = str(increment)
    assert _niceness_after_start(env) == min(19, os.nice(0) + increment)


def test_worker_yields_by_default() -> None:
    assert Settings.model_fields["worker_nice"].default == 10
    env = {k: v for k, v in os.environ.items() if k != "QUANT_WORKER_NICE"}
    assert _niceness_after_start(env) == min(19, os.nice(0) + 10)
