"""A small GPT-style decoder for the weight-only tests and bench: token embedding + learned positions,
2 pre-norm blocks of causal self-attention and a 4x MLP, a final LayerNorm and an LM head (bias-free
Linear), trained for a few hundred steps on a token stream drawn from a sparse random Markov chain
(each token has ``FANOUT`` likely successors), so its logits carry a learned next-token distribution.

``build_decoder()`` returns the ONNX model (input ``tokens`` (N, T) int64, output ``logits`` (N, T,
VOCAB), batch and sequence dynamic) and token windows to calibrate and evaluate on. d_model 48 is not a
multiple of 32, so blocks of 32 along K exercise the padded last block. ``train_on_text`` trains a larger
``Shape`` byte by byte on text for a number of seconds (the weight-only bench's language model).
"""

from __future__ import annotations

import io
import math
import time
import warnings
from dataclasses import dataclass

import numpy as np
import onnx
import torch
from torch import nn

VOCAB, D_MODEL, HEADS, LAYERS, MAX_LEN = 64, 48, 2, 2, 32
FANOUT = 3
OPSET = 17


@dataclass(frozen=True)
class Shape:
    """The decoder's sizes: the tests' defaults, larger for the bench's text model."""

    vocab: int = VOCAB
    d_model: int = D_MODEL
    heads: int = HEADS
    layers: int = LAYERS
    max_len: int = MAX_LEN


class Block(nn.Module):
    def __init__(self, shape: Shape) -> None:
        super().__init__()
        d = self.d_model = shape.d_model
        self.heads = shape.heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.register_buffer("mask", torch.tril(torch.ones(shape.max_len, shape.max_len)).bool(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.reshape(n, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))  # (N, h, T, hs)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        scores = scores.masked_fill(~self.mask[:t, :t], float("-inf"))
        attended = (scores.softmax(-1) @ v).transpose(1, 2).reshape(n, t, d)
        x = x + self.proj(attended)
        return x + self.mlp(self.ln2(x))


class Decoder(nn.Module):
    def __init__(self, shape: Shape = Shape()) -> None:
        super().__init__()
        self.tokens = nn.Embedding(shape.vocab, shape.d_model)
        self.positions = nn.Embedding(shape.max_len, shape.d_model)
        self.blocks = nn.Sequential(*(Block(shape) for _ in range(shape.layers)))
        self.norm = nn.LayerNorm(shape.d_model)
        self.head = nn.Linear(shape.d_model, shape.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tokens(tokens) + self.positions(positions)[None]
        return self.head(self.norm(self.blocks(x)))


def token_stream(rng: np.random.Generator, length: int) -> np.ndarray:
    """``length`` tokens of a Markov chain: each token moves to one of its ``FANOUT`` successors."""
    successors = rng.integers(0, VOCAB, size=(VOCAB, FANOUT))
    stream = np.empty(length, dtype=np.int64)
    stream[0] = 0
    for i in range(1, length):
        stream[i] = successors[stream[i - 1], rng.integers(0, FANOUT)]
    return stream


def windows(stream: np.ndarray, count: int, length: int, rng: np.random.Generator) -> np.ndarray:
    starts = rng.integers(0, stream.size - length - 1, size=count)
    return np.stack([stream[s : s + length] for s in starts])


@dataclass(frozen=True)
class DecoderModel:
    model: onnx.ModelProto
    calibration: dict[str, np.ndarray]  # {"tokens": (N, T) int64}
    evaluation: dict[str, np.ndarray]
    final_loss: float  # the last training step's cross-entropy (log(FANOUT) ≈ 1.1 is what the chain allows)


def build_decoder(*, seed: int = 0, steps: int = 120, calibration: int = 64, evaluation: int = 32) -> DecoderModel:
    """Train the decoder for ``steps`` Adam steps (batch 32, 24 tokens) and export it (module docstring)."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    stream = token_stream(rng, 20_000)
    network = Decoder()
    optimizer = torch.optim.Adam(network.parameters(), lr=3e-3)
    loss = torch.tensor(0.0)
    for _ in range(steps):
        batch = torch.from_numpy(windows(stream, 32, 25, rng))
        logits = network(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return DecoderModel(
        export_decoder(network),
        {"tokens": windows(stream, calibration, 24, rng)},
        {"tokens": windows(stream, evaluation, 24, rng)},
        float(loss.detach()),
    )


def train_on_text(
    text: bytes, shape: Shape, *, seconds: float, calibration: int, evaluation: int, length: int, seed: int = 0
) -> DecoderModel:
    """A byte-level decoder of ``shape`` (vocab 128: bytes past ASCII read as 0) trained with Adam for
    ``seconds`` of wall clock (batch 32 windows of ``length`` + 1 bytes) on the first 90 % of ``text``;
    calibration windows from that part, evaluation windows from the held-out last 10 %."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    stream = np.frombuffer(text, dtype=np.uint8).astype(np.int64)
    stream[stream >= shape.vocab] = 0
    split = int(0.9 * stream.size)
    train, held_out = stream[:split], stream[split:]
    network = Decoder(shape)
    optimizer = torch.optim.AdamW(network.parameters(), lr=2e-3)
    loss = torch.tensor(0.0)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        batch = torch.from_numpy(windows(train, 32, length + 1, rng))
        logits = network(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, shape.vocab), batch[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return DecoderModel(
        export_decoder(network),
        {"tokens": windows(train, calibration, length, rng)},
        {"tokens": windows(held_out, evaluation, length, rng)},
        float(loss.detach()),
    )


def export_decoder(network: Decoder) -> onnx.ModelProto:
    """``network`` in eval mode exported as the module docstring says (tokens in, logits out)."""
    network.eval()
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter warns that it is deprecated
        torch.onnx.export(
            network,
            (torch.zeros(2, 16, dtype=torch.int64),),
            buffer,
            input_names=["tokens"],
            output_names=["logits"],
            dynamic_axes={"tokens": {0: "batch", 1: "sequence"}, "logits": {0: "batch", 1: "sequence"}},
            opset_version=OPSET,
            dynamo=False,
        )
    model = onnx.load_from_string(buffer.getvalue())
    model.ir_version = min(model.ir_version, 10)
    return model
