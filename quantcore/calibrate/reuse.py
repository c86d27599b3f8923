"""Calibrate an annotation that differs from an earlier, calibrated one in a few places (layers kept
float by the accuracy target or the CPU placement, layers promoted by mixed precision), reusing the
earlier scales wherever that is exact.

An activation observer sees the same values, and so ends with the same scale, when its tensors have the
same configs and its shared-scale group (the tensors whose ``dominator`` links end at one root) has the
same members as before; a weight's scale depends only on its config and its initializer. Those configs are
taken as calibrated before. Only the rest (tensors new to the annotation, configs that changed, groups that
gained or lost a member) is calibrated on the data, in one pass that exposes just those tensors: excluding
one region of a large model costs the inference and the observation of its boundary, not of the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from quantcore.annotate.annotation import Annotation
from quantcore.calibrate.calibration import calibrate, dominator_root
from quantcore.config import QuantizeConfig
from quantcore.numerics.tqc import TensorQuantConfig
from quantcore.prepare.preparation import PreparedModel
from quantcore.progress import CancelCheck
from quantcore.runtime.batching import Batches


@dataclass(frozen=True)
class Recalibration:
    annotation: Annotation  # every config calibrated
    calibrated: tuple[str, ...]  # the tensors observed again (empty: the earlier scales cover every one)

    @property
    def reused(self) -> bool:
        return not self.calibrated


def reusable(base: Annotation, calibrated: Annotation, annotation: Annotation) -> dict[str, TensorQuantConfig]:
    """The calibrated configs, from ``calibrated`` (``base`` after calibration), of ``annotation``'s tensors
    whose scale a new calibration would reproduce exactly (see module)."""

    def groups(source: Annotation) -> dict[str, frozenset[str]]:
        members: dict[str, set[str]] = {}
        for name in source.activations:
            members.setdefault(dominator_root(name, source.configs), set()).add(name)
        return {root: frozenset(names) for root, names in members.items()}

    same = {name for name, tqc in annotation.configs.items() if base.configs.get(name) == tqc}
    before = groups(base)
    reused = {name for name in annotation.parameters if name in same and name in base.parameters}
    for root, members in groups(annotation).items():
        if before.get(root) == members and members <= same:
            reused |= members
    return {name: calibrated.configs[name] for name in annotation.configs if name in reused}


def _restricted(annotation: Annotation, names: set[str]) -> Annotation:
    """``annotation`` with only the tensors ``names`` (and the bias links between them) annotated."""
    return replace(
        annotation,
        configs={n: tqc for n, tqc in annotation.configs.items() if n in names},
        consumers={n: uses for n, uses in annotation.consumers.items() if n in names},
        parameters=annotation.parameters & names,
        biases={b: link for b, link in annotation.biases.items() if {link.activation, link.weight} <= names},
    )


def recalibrate(
    prepared: PreparedModel,
    base: Annotation,
    calibrated: Annotation,
    annotation: Annotation,
    data: Mapping[str, np.ndarray] | Batches,
    config: QuantizeConfig,
    *,
    should_cancel: CancelCheck | None = None,
) -> Recalibration:
    """``annotation`` calibrated on ``data``: ``calibrated``'s scales where they are exact (``reusable``),
    the other tensors observed on ``data``. Precondition: ``calibrated`` is ``base`` calibrated on ``data``
    for ``config`` (the clip applied), and ``prepared`` is the model both annotate."""
    reused = reusable(base, calibrated, annotation)
    rest = [name for name in annotation.configs if name not in reused]
    if not rest:
        return Recalibration(annotation.with_configs(reused), ())
    fresh = calibrate(prepared, _restricted(annotation, set(rest)), data, config, should_cancel=should_cancel)
    configs = {name: reused[name] if name in reused else fresh.configs[name] for name in annotation.configs}
    merged = replace(annotation.with_configs(configs), notes=fresh.notes)
    return Recalibration(merged, tuple(rest))
