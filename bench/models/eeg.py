"""EEG inputs of the bench's brainmaze-eeg-models cases (``bench.models.unseen``): synthesized recordings
(1/f background, alpha, slow waves, sleep spindles; for the seizure model, rhythmic spike-and-wave
seizures), through each model's own preprocessing.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

SPINDLE_RATE, SPINDLE_WINDOW = 250, 7500  # the spindle detector's 30 s windows at 250 Hz
SEIZURE_RATE, SEIZURE_SECONDS, SEIZURE_BINS = 256, 60, 100  # 1 Hz spectrogram bins 0-99 Hz, 0.5 s hop


def background(rng: np.random.Generator, n: int, rate: int) -> np.ndarray:
    """(n,) EEG background in µV: 1/f noise (40 µV rms), alpha (8-12 Hz, 10-30 µV) waxing and waning, and
    a few slow waves (0.5-2 Hz, 50-150 µV, one cycle each)."""
    spectrum = np.fft.rfft(rng.normal(size=n))
    frequencies = np.fft.rfftfreq(n, 1 / rate)
    pink = np.fft.irfft(spectrum / np.sqrt(np.maximum(frequencies, 0.5)), n)
    t = np.arange(n) / rate
    signal = 40 * pink / pink.std()
    signal += rng.uniform(10, 30) * np.sin(2 * np.pi * rng.uniform(8, 12) * t) * (0.5 + 0.5 * np.sin(0.3 * t))
    for _ in range(int(rng.integers(0, 6))):
        f, start = rng.uniform(0.5, 2), rng.uniform(0, n / rate)
        cycle = (t >= start) & (t < start + 1 / f)
        signal[cycle] -= rng.uniform(50, 150) * np.sin(2 * np.pi * f * (t[cycle] - start))
    return signal


def spindle_recording(rng: np.random.Generator) -> np.ndarray:
    """A 30 s window at 250 Hz: ``background`` with 0-6 sleep spindles (11-16 Hz, 0.5-2 s, 20-60 µV under
    a Hann envelope, the waxing and waning shape that defines them)."""
    t = np.arange(SPINDLE_WINDOW) / SPINDLE_RATE
    signal = background(rng, SPINDLE_WINDOW, SPINDLE_RATE)
    for _ in range(int(rng.integers(0, 7))):
        length = int(rng.uniform(0.5, 2) * SPINDLE_RATE)
        start = int(rng.integers(0, SPINDLE_WINDOW - length))
        burst = np.sin(2 * np.pi * rng.uniform(11, 16) * t[:length]) * np.hanning(length)
        signal[start : start + length] += rng.uniform(20, 60) * burst
    return signal


def _zscore(a: np.ndarray) -> np.ndarray:
    """Per-row z-score over the last axis (the detector's ``_normalize``)."""
    return (a - a.mean(axis=-1, keepdims=True)) / a.std(axis=-1, keepdims=True)


def spindle_inputs(root: Path, samples: int, seed: int) -> dict[str, np.ndarray]:
    """The spindle detector's inputs as its ``SpindleDetector`` makes them for the 'eeg' model: each window
    demeaned, its 15-scale Shannon wavelet scalogram (the wheel's own ``_cwt.scalogram``, loaded from its
    file) z-scored per scale, ``spectrogram`` (N, 15, 7500), and the z-scored window, ``raw_signal``
    (N, 1, 7500)."""
    path = root / "brainmaze_eeg_models/spindles/_cwt.py"
    spec = importlib.util.spec_from_file_location("spindle_cwt", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rng = np.random.default_rng(seed)
    windows = np.stack([spindle_recording(rng) for _ in range(samples)])
    windows -= windows.mean(axis=-1, keepdims=True)
    return {
        "raw_signal": _zscore(windows[:, None, :]).astype(np.float32),
        "spectrogram": _zscore(module.scalogram(windows)).astype(np.float32),
    }


def seizure_recording(rng: np.random.Generator, seizing: bool) -> np.ndarray:
    """60 s of iEEG at 256 Hz: ``background``, and when ``seizing`` a seizure of 10-40 s starting in the
    first half: spike-and-wave discharges at 3-8 Hz whose rate slows and amplitude grows (100 → 400 µV)."""
    n = SEIZURE_SECONDS * SEIZURE_RATE
    signal = background(rng, n, SEIZURE_RATE)
    if seizing:
        length = int(rng.uniform(10, 40) * SEIZURE_RATE)
        start = int(rng.integers(0, n // 2))
        length = min(length, n - start)
        progress = np.arange(length) / length
        phase = 2 * np.pi * np.cumsum(rng.uniform(5, 8) - 3 * progress) / SEIZURE_RATE
        spikes = np.exp(8 * (np.cos(phase) - 1)) - 0.3 * np.sin(phase / 2) ** 2  # sharp spike, slow wave
        signal[start : start + length] += (100 + 300 * progress) * spikes
    return signal


def seizure_inputs(samples: int, seed: int) -> np.ndarray:
    """The seizure model's inputs (N, 100, 119) as its ``preprocess_input`` makes them (re-stated here: the
    package module imports its runtime): each recording z-scored, a spectrogram of 1 s segments every 0.5 s
    (``scipy.signal.spectrogram``, ``nperseg`` = rate), the bins 0-99 Hz kept, each bin z-scored over time.
    Every other recording holds a seizure."""
    from scipy.signal import spectrogram

    rng = np.random.default_rng(seed)
    recordings = np.stack([seizure_recording(rng, i % 2 == 1) for i in range(samples)])
    _, _, power = spectrogram(
        _zscore(recordings), SEIZURE_RATE, nperseg=SEIZURE_RATE, noverlap=SEIZURE_RATE // 2, axis=1
    )
    return _zscore(power[:, :SEIZURE_BINS, :]).astype(np.float32)
