"""Observers: streaming statistics of a tensor's values, one batch at a time.

Observers only observe: ``observe(x)`` folds one batch into a bounded state, ``bounds()`` returns
the range (lo, hi) the statistics support. Turning a range into scale and offset is
``quantcore.numerics.scaling.scale_offset``, the single place where that happens. State never grows with the
number of batches (``state_nbytes`` lets tests check it); no sample is ever buffered.

Registry: ``OBSERVERS[name](ObserverSettings(...))`` builds an observer (every factory takes the one
settings object and reads the fields it needs); ``TensorQuantConfig.observer`` holds one of these names
(``quantcore.numerics.tqc.ObserverName``):

    minmax       running min / max
    ema_minmax   exponential moving average of each batch's min / max: m ← μ·m + (1-μ)·m_batch
    percentile   |x| percentile from a streamed histogram                 (``quantcore.observers.histogram``)
    kl           TensorRT entropy calibration on the histogram            (``quantcore.observers.clipping``)
    mse          threshold minimising quantization MSE on the tqc's grid  (``quantcore.observers.clipping``)
    floating     FP8 scale search (MSE on the FP8 grid)                   (``quantcore.observers.clipping``)
    constant     the tqc's ``constant_range``, whatever the data

``axis`` (not None) makes a per-channel observer: one range per slice along ``axis``; histogram
observers then keep one histogram per channel (C x bins counters).

``complete`` says whether the statistics determine ``bounds()``. Only ``percentile`` can be incomplete:
it resolves just the histogram's tail (``quantcore.observers.histogram``), and data whose later batches are far
lighter-tailed than the first can leave its percentile below the resolved bins; the data must then be
observed again by an observer built with ``resolve_all=True``, which is always complete.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from quantcore.numerics.tqc import ObserverName, TensorQuantConfig
from quantcore.observers.clipping import FloatingObserver, KLObserver, MSEObserver
from quantcore.observers.histogram import HistogramObserver, PercentileObserver, finite_values

__all__ = [
    "ACTIVATION_OBSERVERS",
    "OBSERVERS",
    "ConstantObserver",
    "EMAMinMaxObserver",
    "FloatingObserver",
    "HistogramObserver",
    "KLObserver",
    "MSEObserver",
    "MinMaxObserver",
    "Observer",
    "ObserverSettings",
    "PerChannelObserver",
    "PercentileObserver",
]


class Observer(Protocol):
    nonfinite: int  # count of NaN/inf values seen (ignored by the statistics)

    @property
    def complete(self) -> bool: ...

    def observe(self, x: np.ndarray) -> None: ...

    def bounds(self) -> tuple[np.ndarray, np.ndarray]: ...

    @property
    def state_nbytes(self) -> int: ...


def _channel_extremes(x: np.ndarray, axis: int | None) -> tuple[np.ndarray, np.ndarray, int] | None:
    """(lo, hi, non-finite count) of one batch: scalars, or (C,) along ``axis``; None if nothing finite."""
    if axis is None:
        lo, hi = x.min(), x.max()
        if np.isfinite(lo) and np.isfinite(hi):  # NaN propagates through min/max: no separate finite pass
            return np.asarray(lo, np.float64), np.asarray(hi, np.float64), 0
        values, bad = finite_values(x)
        if values.size == 0:
            return None if bad == 0 else (np.asarray(np.inf), np.asarray(-np.inf), bad)
        return np.asarray(values.min(), np.float64), np.asarray(values.max(), np.float64), bad
    channels = np.moveaxis(x, axis, 0).reshape(x.shape[axis], -1)  # (C, rest)
    finite = np.isfinite(channels)
    bad = int(channels.size - finite.sum())
    if bad:
        lo = np.where(finite, channels, np.inf).min(axis=1).astype(np.float64)
        hi = np.where(finite, channels, -np.inf).max(axis=1).astype(np.float64)
    else:
        lo, hi = channels.min(axis=1).astype(np.float64), channels.max(axis=1).astype(np.float64)
    return lo, hi, bad


def _reported(lo: np.ndarray | None, hi: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    if lo is None or hi is None:
        return np.asarray(0.0), np.asarray(0.0)
    # A channel that only ever saw non-finite values keeps ±inf; report it as empty (0, 0).
    return np.where(np.isfinite(lo), lo, 0.0), np.where(np.isfinite(hi), hi, 0.0)


class MinMaxObserver:
    """Running minimum and maximum: lo = min over all batches of x, hi = max of x.

    Per-tensor (``axis=None``): scalars. Per-channel: vectors of length C = x.shape[axis], each
    reduced over every other axis.
    """

    complete = True

    def __init__(self, axis: int | None = None) -> None:
        self.axis = axis
        self.lo: np.ndarray | None = None
        self.hi: np.ndarray | None = None
        self.nonfinite = 0

    def _batch_extremes(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """One batch's (lo, hi) (see ``_channel_extremes``), its non-finite values counted; None for a
        batch with nothing to fold in."""
        x = np.asarray(x)
        extremes = _channel_extremes(x, self.axis) if x.size else None
        if extremes is None:
            return None
        lo, hi, bad = extremes
        self.nonfinite += bad
        return lo, hi

    def observe(self, x: np.ndarray) -> None:
        extremes = self._batch_extremes(x)
        if extremes is None:
            return
        lo, hi = extremes
        self.lo = lo if self.lo is None else np.minimum(self.lo, lo)
        self.hi = hi if self.hi is None else np.maximum(self.hi, hi)

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        return _reported(self.lo, self.hi)

    @property
    def state_nbytes(self) -> int:
        return sum(a.nbytes for a in (self.lo, self.hi) if a is not None)


class EMAMinMaxObserver(MinMaxObserver):
    """Exponential moving average of each batch's min and max (torch.ao's MovingAverageMinMax)::

        lo ← μ·lo + (1 - μ)·min(x_batch)        hi ← μ·hi + (1 - μ)·max(x_batch)

    with ``momentum`` μ ∈ [0, 1) (μ = 0 is the last batch's range); the first batch sets lo, hi.
    """

    def __init__(self, axis: int | None = None, momentum: float = 0.9) -> None:
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        super().__init__(axis=axis)
        self.momentum = float(momentum)

    def observe(self, x: np.ndarray) -> None:
        extremes = self._batch_extremes(x)
        if extremes is None:
            return
        lo, hi = extremes
        if self.lo is None or self.hi is None:
            self.lo, self.hi = lo, hi
            return
        mu = self.momentum
        # a channel without finite values in this batch keeps its average
        self.lo = np.where(np.isfinite(lo), mu * self.lo + (1 - mu) * lo, self.lo)
        self.hi = np.where(np.isfinite(hi), mu * self.hi + (1 - mu) * hi, self.hi)
        self.lo = np.where(np.isfinite(self.lo), self.lo, lo)  # first finite value of a channel
        self.hi = np.where(np.isfinite(self.hi), self.hi, hi)


class ConstantObserver:
    """Reports the given range (lo, hi) whatever it sees (per channel: the same range for each of the
    C channels, C learnt from the first batch). Non-finite values are still counted."""

    complete = True

    def __init__(self, lo: float, hi: float, axis: int | None = None) -> None:
        if not lo <= hi:
            raise ValueError(f"constant range needs lo <= hi, got ({lo}, {hi})")
        self.lo, self.hi, self.axis = float(lo), float(hi), axis
        self.channels: int | None = None
        self.nonfinite = 0

    def observe(self, x: np.ndarray) -> None:
        x = np.asarray(x)
        self.nonfinite += int(x.size - np.isfinite(x).sum())
        if self.axis is not None and x.ndim:
            self.channels = x.shape[self.axis]

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        if self.axis is None:
            return np.asarray(self.lo), np.asarray(self.hi)
        if self.channels is None:
            raise ValueError("a per-channel constant observer needs one observed batch to know C")
        return np.full(self.channels, self.lo), np.full(self.channels, self.hi)

    @property
    def state_nbytes(self) -> int:
        return 4 * 8


class PerChannelObserver:
    """One per-tensor observer per slice along ``axis`` (built by ``make()`` on the first batch);
    ``bounds()`` stacks their ranges into (C,) vectors. Memory: C times the per-tensor state."""

    def __init__(self, axis: int, make: Callable[[], Observer]) -> None:
        self.axis = axis
        self.make = make
        self.channels: list[Observer] = []

    @property
    def nonfinite(self) -> int:
        return sum(o.nonfinite for o in self.channels)

    @property
    def complete(self) -> bool:
        return all(o.complete for o in self.channels)

    def observe(self, x: np.ndarray) -> None:
        x = np.asarray(x)
        if x.size == 0:
            return
        slices = np.moveaxis(x, self.axis, 0)  # (C, ...)
        if not self.channels:
            self.channels = [self.make() for _ in range(slices.shape[0])]
        if len(self.channels) != slices.shape[0]:
            raise ValueError(f"channel count changed from {len(self.channels)} to {slices.shape[0]}")
        for observer, values in zip(self.channels, slices, strict=True):
            observer.observe(values)

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.channels:
            return np.asarray(0.0), np.asarray(0.0)
        pairs = [o.bounds() for o in self.channels]
        return np.array([float(lo) for lo, _ in pairs]), np.array([float(hi) for _, hi in pairs])

    @property
    def state_nbytes(self) -> int:
        return sum(o.state_nbytes for o in self.channels)


@dataclass(frozen=True)
class ObserverSettings:
    """What an observer factory builds from; each factory reads the fields its observer uses and the
    observer checks their values.

    axis: None for per-tensor, else the channel axis (one range per slice). tqc: the target grid; the
    histogram observers clip for it (kl/mse/floating search their threshold on it, an asymmetric grid
    gets a one-sided range) and ``constant`` reports its ``constant_range``.
    percentile: amax of ``percentile`` is that percentile of |x|. momentum: μ of ``ema_minmax``.
    bins: histogram bins of the histogram observers. resolve_all: a ``percentile`` observer that
    resolves every bin, hence is ``complete`` whatever the data (see module).
    """

    axis: int | None = None
    tqc: TensorQuantConfig | None = None
    percentile: float = 99.99
    momentum: float = 0.9
    bins: int = 2048
    resolve_all: bool = False


ObserverFactory = Callable[[ObserverSettings], Observer]


def _per_channel_or_tensor(axis: int | None, make: Callable[[], Observer]) -> Observer:
    return make() if axis is None else PerChannelObserver(axis, make)


def _minmax(settings: ObserverSettings) -> Observer:
    return MinMaxObserver(axis=settings.axis)


def _ema_minmax(settings: ObserverSettings) -> Observer:
    return EMAMinMaxObserver(axis=settings.axis, momentum=settings.momentum)


def _percentile(settings: ObserverSettings) -> Observer:
    return _per_channel_or_tensor(
        settings.axis,
        lambda: PercentileObserver(
            percentile=settings.percentile, bins=settings.bins, tqc=settings.tqc, resolve_all=settings.resolve_all
        ),
    )


def _kl(settings: ObserverSettings) -> Observer:
    return _per_channel_or_tensor(settings.axis, lambda: KLObserver(bins=settings.bins, tqc=settings.tqc))


def _mse(settings: ObserverSettings) -> Observer:
    return _per_channel_or_tensor(settings.axis, lambda: MSEObserver(bins=settings.bins, tqc=settings.tqc))


def _floating(settings: ObserverSettings) -> Observer:
    return _per_channel_or_tensor(settings.axis, lambda: FloatingObserver(bins=settings.bins, tqc=settings.tqc))


def _constant(settings: ObserverSettings) -> Observer:
    if settings.tqc is None or settings.tqc.constant_range is None:
        raise ValueError("the constant observer needs tqc=TensorQuantConfig(observer='constant', constant_range=...)")
    return ConstantObserver(*settings.tqc.constant_range, axis=settings.axis)


OBSERVERS: dict[ObserverName, ObserverFactory] = {
    "minmax": _minmax,
    "ema_minmax": _ema_minmax,
    "percentile": _percentile,
    "kl": _kl,
    "mse": _mse,
    "floating": _floating,
    "constant": _constant,
}
# The choices QuantizeConfig.observer offers for activations ("constant" needs a per-tensor range).
ACTIVATION_OBSERVERS: tuple[ObserverName, ...] = ("minmax", "ema_minmax", "percentile", "kl", "mse", "floating")


def make_observer(tqc: TensorQuantConfig, settings: ObserverSettings = ObserverSettings()) -> Observer:
    """The observer ``tqc.observer`` names, aimed at ``tqc``'s grid and per-channel along
    ``tqc.channel_axis`` when per-channel: ``tqc`` sets the settings' ``tqc`` and ``axis``, the other
    fields are taken as given."""
    axis = tqc.channel_axis if tqc.per_channel else None
    return OBSERVERS[tqc.observer](replace(settings, axis=axis, tqc=tqc))
