"""Blockwise weight grids: a (K, N) weight W (K the reduction axis) cut into blocks of ``block_size``
rows along K, each column of each block with its own scale s and zero point z::

    q = clip(round(w / s) + z, 0, 2^b - 1),    ŵ = (q - z) · s

symmetric: z = 2^(b-1) and s = -m / 2^(b-1), m the block column's value of largest magnitude with its
sign: m lands exactly on the lowest code (q - z = -2^(b-1)), so the grid spends all 2^b codes with steps
of max|w| / 2^(b-1), and only values of the other sign beyond (2^(b-1) - 1/2) steps are clipped, by at most
one step. s is negative where m is positive; both formats multiply by it as stored. This is llama.cpp's
Q4_0 grid and ONNX Runtime's symmetric MatMulNBits quantizer's; GPTQ's reference grid, s = 2·max|w| /
(2^b - 1), has steps 2^b / (2^b - 1) times as wide and clips m itself by half a step where m > 0
(SmolLM2-135M, w4/32 RTN: perplexity +17.7 % over FP32 against +28.9 %). Asymmetric: the block's range
widened to 0, s = (max - min) / (2^b - 1), z = round(-min / s). A block of zeros gets s = 1 (any scale
reproduces it). K need not be a multiple of ``block_size``: the last block is short, as if padded with
zeros (zeros change neither max|w| nor a range widened to 0), which is how MatMulNBits pads it.
Scales are float32, and codes are computed with the float32 scale that is stored, so ŵ is exactly
what ONNX Runtime dequantizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BlockGrid:
    """The grid of one run: ``bits`` (4 or 8), ``block_size`` rows per block along K, symmetric or not."""

    bits: int
    block_size: int
    symmetric: bool

    @property
    def quant_max(self) -> int:
        return 2**self.bits - 1

    @property
    def default_zero_point(self) -> int:
        """z of every symmetric block; also MatMulNBits' zero point when it is given none."""
        return 2 ** (self.bits - 1)

    def num_blocks(self, k: int) -> int:
        return -(-k // self.block_size)

    def params(self, block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(scale (N,) float32, zero point (N,) float64 integers) of a (rows, N) block, rows <= block_size."""
        block = np.asarray(block, dtype=np.float64)
        if self.symmetric:
            extreme = block[np.abs(block).argmax(axis=0), np.arange(block.shape[1])]
            scale = -extreme / self.default_zero_point
            zero = np.full(block.shape[1], float(self.default_zero_point))
        else:
            low, high = np.minimum(block.min(axis=0), 0.0), np.maximum(block.max(axis=0), 0.0)
            scale = (high - low) / self.quant_max
            zero = None
        scale = np.where(scale != 0, scale, 1.0).astype(np.float32)
        if zero is None:
            zero = np.clip(np.round(-low / scale.astype(np.float64)), 0, self.quant_max)
        return scale, zero

    def codes(self, w: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
        """q = clip(round(w / s) + z, 0, 2^b - 1) (float64, integer valued); w (..., N), s and z (N,)."""
        return np.clip(np.round(np.asarray(w, np.float64) / scale.astype(np.float64)) + zero, 0, self.quant_max)

    def rounded(self, w: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
        """ŵ = (q - z) · s in float64, the value the stored codes dequantize to."""
        return (self.codes(w, scale, zero) - zero) * scale.astype(np.float64)


@dataclass(frozen=True)
class BlockwiseWeight:
    """A quantized (K, N) weight: codes (K, N) uint8 in [0, 2^b - 1], scales and zero points (blocks, N)."""

    grid: BlockGrid
    codes: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape

    def dequantize(self) -> np.ndarray:
        """ŵ = (q - z) · s (K, N) float32, one block of rows at a time: no (K, N) temporary beside it."""
        dequantized = np.empty(self.codes.shape, dtype=np.float32)
        size = self.grid.block_size
        for index, start in enumerate(range(0, self.codes.shape[0], size)):
            block = self.codes[start : start + size].astype(np.float32)
            block -= self.zero_points[index].astype(np.float32)
            dequantized[start : start + size] = block * self.scales[index]
        return dequantized


def assemble(grid: BlockGrid, codes: np.ndarray, scales: list[np.ndarray], zeros: list[np.ndarray]) -> BlockwiseWeight:
    """A ``BlockwiseWeight`` from (K, N) integer-valued codes (any numeric dtype) and one (scale, zero
    point) row per block."""
    return BlockwiseWeight(
        grid, codes.astype(np.uint8, copy=False), np.stack(scales).astype(np.float32), np.stack(zeros).astype(np.uint8)
    )


def quantize_rtn(weight: np.ndarray, grid: BlockGrid, clip: np.ndarray | None = None) -> BlockwiseWeight:
    """Round to nearest, block by block: each block's scale from its own values (module docstring);
    ``clip`` (blocks, N) in (0, 1]: each block column's range shrunk by that ratio before its scale is
    taken (AWQ's clip search), the values beyond it clipped to the grid's ends."""
    weight = np.asarray(weight, dtype=np.float32)
    codes = np.empty(weight.shape, dtype=np.uint8)  # integer codes in [0, 2^b - 1]; float64 per block only
    scales, zeros = [], []
    for index, start in enumerate(range(0, weight.shape[0], grid.block_size)):
        block = weight[start : start + grid.block_size]
        scale, zero = grid.params(block if clip is None else block * clip[index])
        codes[start : start + grid.block_size] = grid.codes(block, scale, zero)
        scales.append(scale)
        zeros.append(zero)
    return assemble(grid, codes, scales, zeros)
