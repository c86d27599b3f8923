"""khmersm's Khmer word segmenter for the bench (``bench.models.unseen``): its model as one file, and Khmer
text to segment, made of syllables of the letters its vocabulary holds, each letter as frequent as its
vocabulary's order says (the ids were assigned by frequency in its training text).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

LENGTH = 64  # characters per sample: a run of Khmer text, as its ``segment`` cuts text at non-Khmer characters
CONSONANTS = range(0x1780, 0x17A3)
VOWELS = range(0x17B6, 0x17C6)  # dependent vowels
SIGNS = range(0x17C6, 0x17D2)  # nikahit, reahmuk, bantoc, ...
COENG = "\u17d2"  # the sign that writes the next consonant as a subscript


def khmer_model(source: Path, target: Path) -> Path:
    """``source`` (its weights in ``model.onnx.data`` beside it) written whole to ``target``, once, with its
    batch dimension declared 1: the exported graph reshapes to a batch of 1 (a batch of 4 fails in a
    Reshape), as its ``Segmenter`` runs it, one text at a time."""
    import onnx

    if target.is_file():
        return target
    model = onnx.load(str(source))
    for value in model.graph.input:
        value.type.tensor_type.shape.dim[0].dim_value = 1
    target.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(target))
    return target


def khmer_inputs(config: Path, samples: int, seed: int) -> dict[str, np.ndarray]:
    """``x`` (N, LENGTH) int64 character ids (its ``_encode_chars``) and ``mask`` (N, LENGTH), all true as its
    ``Segmenter`` passes it: syllables of a consonant, a subscript consonant (a quarter of them), a vowel
    (70 %), a final consonant (30 %) and a sign (15 %), letters drawn with weight 1 / (1 + id)."""
    char2id: dict[str, int] = json.loads(config.read_text(encoding="utf-8"))["char2id"]
    rng = np.random.default_rng(seed)

    def letters(codes: range) -> tuple[list[str], np.ndarray]:
        chosen = [chr(c) for c in codes if chr(c) in char2id]
        weights = np.array([1.0 / (1 + char2id[c]) for c in chosen])
        return chosen, weights / weights.sum()

    consonants, vowels, signs = letters(CONSONANTS), letters(VOWELS), letters(SIGNS)

    def pick(group: tuple[list[str], np.ndarray]) -> str:
        return str(rng.choice(group[0], p=group[1]))

    texts = []
    for _ in range(samples):
        text = ""
        while len(text) < LENGTH:
            text += pick(consonants)
            text += COENG + pick(consonants) if rng.random() < 0.25 else ""
            text += pick(vowels) if rng.random() < 0.7 else ""
            text += pick(consonants) if rng.random() < 0.3 else ""
            text += pick(signs) if rng.random() < 0.15 else ""
        texts.append([char2id[c] for c in text[:LENGTH]])
    x = np.array(texts, np.int64)
    return {"x": x, "mask": np.ones_like(x, dtype=bool)}
