"""Under ``cpu_objective="latency"``: of the candidates that meet the objective, the one whose deployed model
is clearly faster than the most accurate one.

The search keeps the most accurate candidate (``quantcore.auto.scoring.choose``). A user whose objective is
a threshold and whose deployment favours latency (``cpu_objective="latency"``, the service's default on the
``onnxruntime`` platform) has said that accuracy beyond the threshold is worth less than speed. Some
candidates trade one for the other: full int8 weights on a CPU without VNNI (``full_weights``) can be a
few dB more accurate and take the integer kernels' gain away; float islands of mixed precision cost their
conversions. So where the kept candidate meets the objective, the others that meet it are timed against it
(``quantcore.auto.timing``), and one clearly faster is kept instead.

Which are timed: candidates that produced a model, whose final run fits the time left, and whose score meets
the objective at the worse end of its bootstrap interval on the selection split (``paired_scores.worse_end``), not
only at its point: one just over the threshold would fall under it on other samples. Deployed models that
share a timing signature (``paired_latency.signature``: observers, the clip search, equalization and bias
correction change values, not the graph) run at the same speed, so one model per signature is timed: the
kept one's own, and elsewhere the most accurate of its signature (``choose``). A timed model replaces the one
kept so far when ``compare`` calls it ``faster`` (clearly faster at one batch size, clearly slower at none),
in the candidates' order; a model ONNX Runtime refuses to time is not kept. The timing's batch sizes are
held to the time left but the largest final run among the timed, and the report says which were left out
(or that none fitted, and nothing was compared).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import onnx

from quantcore.auto.scoring import choose
from quantcore.auto.search import STAGE, Search, Tried
from quantcore.auto.timing import p50_change, time_models
from quantcore.config import QuantizeConfig
from quantcore.evaluate.paired_latency import Timing, compare, signature
from quantcore.numerics.paired_scores import worse_end
from quantcore.wording import counted


@dataclass(frozen=True)
class SpeedChoice:
    """The candidate kept and the report's ``speed`` entry (None: the config's deployment does not favour
    latency, or the kept candidate does not meet the objective)."""

    kept: Tried
    entry: dict[str, Any] | None


def faster_meeting(
    search: Search,
    tried: list[Tried],
    kept: Tried,
    config: QuantizeConfig,
    seconds_left: float,
) -> SpeedChoice:
    """``kept``, or a candidate of ``tried`` clearly faster that meets the objective, as the module says."""
    objective = config.auto.objective
    if config.cpu_objective != "latency" or kept.error is not None or not kept.met:
        return SpeedChoice(kept, None)
    meeting = [
        t
        for t in tried
        if t is kept
        or (
            t.error is None
            and t.final_seconds <= seconds_left
            and objective.met(worse_end(t.sums, objective.higher_is_better))
        )
    ]
    groups: dict[str, list[Tried]] = {}
    for t in meeting:
        groups.setdefault(signature(onnx.load(str(t.model_path), load_external_data=False)), []).append(t)
    timed = [_standing(group, kept, objective.higher_is_better) for group in groups.values()]
    entry: dict[str, Any] = {
        "most_accurate": kept.name,
        "compared": [
            {"name": t.name, "stands_for": [o.name for o in group if o is not t]}
            for t, group in zip(timed, groups.values(), strict=True)
        ],
    }
    if len(timed) == 1:
        return SpeedChoice(kept, {**entry, "verdict": _alone(meeting)})
    reserve = max(t.final_seconds for t in timed)
    sample_seconds = [t.sample_seconds for t in timed]
    models = [t.model_path for t in timed]
    shown = f"comparing the speed of {counted(len(timed), 'candidate')} that meet the objective"
    search.monitor.report(STAGE, 1.0, shown)
    left = seconds_left - reserve
    measured = time_models(models, sample_seconds, search.specs, config, left, search.split.selection, search.timed)
    if isinstance(measured, str):
        return SpeedChoice(kept, {**entry, "verdict": f"not timed: {measured}, the final run held back"})
    entry |= {
        "batch_sizes": list(measured.batch_sizes),
        "threads": measured.threads,
        "left_out": measured.left_out,
        "reused": measured.reused,
    }
    timings = measured.timings
    fastest = next(i for i, t in enumerate(timed) if t is kept)
    for i, timing in enumerate(timings):
        if i != fastest and not isinstance(timing, str) and compare(timing, timings[fastest]) == "faster":
            fastest = i
    entry["compared"] = [{**row, **measured.shown(i)} for i, row in enumerate(entry["compared"])]
    chosen = timed[fastest]
    verdict = _verdict(kept, chosen, timings, timed)
    if measured.left_out is not None:
        verdict += f" ({measured.left_out}, the final run held back)"
    entry |= {"seconds": round(measured.seconds, 3), "verdict": verdict}
    return SpeedChoice(chosen, entry)


def _standing(group: list[Tried], kept: Tried, higher_is_better: bool) -> Tried:
    """The candidate timed for ``group`` (one deployed graph): ``kept`` where it is one of them, else the most
    accurate."""
    if any(t is kept for t in group):
        return kept
    return group[choose([t.sums for t in group], [True] * len(group), higher_is_better)]


def _alone(meeting: list[Tried]) -> str:
    if len(meeting) == 1:
        return "not timed: no other candidate meets the objective across its interval"
    return "not timed: every candidate that meets the objective deploys the same graph, so runs at the same speed"


def _verdict(kept: Tried, chosen: Tried, timings: list[dict[int, Timing] | str], timed: list[Tried]) -> str:
    if chosen is kept:
        return f"{kept.name} kept: none of the others that meet the objective is clearly faster"
    mine, theirs = (next(timing for t, timing in zip(timed, timings, strict=True) if t is c) for c in (chosen, kept))
    assert not isinstance(mine, str) and not isinstance(theirs, str)  # a refused model is never chosen
    shown = p50_change(theirs, mine)
    return (
        f"{chosen.name} kept over the more accurate {kept.name}: it meets the objective too and its deployed model is "
        f"clearly faster (p50 {shown})"
    )
