"""Options of weight-only quantization on the onnxruntime-weight-only platform (``quantcore.weight_only``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quantcore.checks import require_bool, require_choice, require_range
from quantcore.config.choices import WEIGHT_ONLY_ALGORITHMS, WEIGHT_ONLY_BLOCK_SIZES, WEIGHT_ONLY_FORMATS


@dataclass(frozen=True)
class WeightOnlyConfig:
    """Weight-only quantization of MatMul/Gemm weights (platform ``onnxruntime-weight-only``,
    ``quantcore.weight_only``); the bits are the precision's (``w4``, ``w8``).

    algorithm: ``rtn`` (round to nearest), ``gptq`` (Frantar et al. 2022: column by column with the
    rounding error compensated through H = 2·XᵀX/n of the calibration data), ``awq`` (Lin et al. 2023:
    weight rows scaled by mean|x|^alpha of their input channel before rounding, the input divided back,
    alpha searched per group of layers sharing an input on the calibration data) or ``hqq`` (Badri & Shaji
    2023, data-free: each block's scale and zero point fitted to the weights by half-quadratic
    alternating minimisation). block_size: weights per
    scale along the reduction axis K, a power of two in [16, 256]; K need not be a multiple (the last
    block is padded with zeros, as MatMulNBits pads). symmetric: zero point fixed at 2^(bits-1) (codes
    stored signed in ``dequantize_linear``), else a zero point per block. format: ``matmulnbits``
    (``com.microsoft.MatMulNBits``, ONNX Runtime's CPU kernel) or ``dequantize_linear`` (opset-21 blocked
    DequantizeLinear of int4/uint4/int8/uint8 codes before the float MatMul/Gemm; the model is converted
    to opset 21). act_order: GPTQ visits the columns by decreasing H diagonal (the block scales are then
    computed from the original weights first, GPTQ's ``static_groups``, so that blocks stay contiguous).
    damping: λ = damping·mean(diag H) added to H's diagonal. quantize_lm_head: also quantize the last
    MatMul/Gemm writing a graph output (kept float by default: its error reaches the logits unfiltered).
    quantize_embeddings: also quantize each embedding table (a Gather along axis 0 of a 2-D float32
    initializer read by nothing else), in blocks along its rows, by round to nearest (HQQ with ``hqq``: a
    lookup has no activation for GPTQ or AWQ to weigh): ``com.microsoft.GatherBlockQuantized`` in
    ``matmulnbits``, a blocked DequantizeLinear before the Gather in ``dequantize_linear`` (which ONNX
    Runtime runs over the whole table on every call, ``bench.table_lookup``: 424x an FP32 Gather's time
    for a 49,152 x 576 table at w4, GatherBlockQuantized 0.3x; the report notes it). Kept float by
    default, as ONNX Runtime's quantizer keeps it.
    accuracy_level: ``matmulnbits``' attribute of that name, what ONNX Runtime's CPU kernel computes the
    activation in: 4 (the default) quantizes it to int8 per block inside the kernel, the integer path (a
    512-wide w4 decoder at batch 1 on a 2-core EPYC with VNNI, against FP32's time: one token 0.38x, against
    0.60x on the float path; 24 tokens 0.82-1.07x, against 1.46-1.71x); 0 (unset) and 1 float32, 2 float16,
    3 bfloat16. ONNX Runtime gives the ``dequantize_linear`` format's fused kernels 4 as well; the
    report's deployed figures include what it costs, its exact ones the weights' rounding alone.
    """

    algorithm: str = "rtn"
    block_size: int = 32
    symmetric: bool = True
    format: str = "matmulnbits"
    act_order: bool = False
    damping: float = 0.01
    quantize_lm_head: bool = False
    quantize_embeddings: bool = False
    accuracy_level: int = 4

    def __post_init__(self) -> None:
        require_choice("weight_only.algorithm", self.algorithm, WEIGHT_ONLY_ALGORITHMS)
        require_range("weight_only.block_size", self.block_size, *WEIGHT_ONLY_BLOCK_SIZES, integer=True)
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"weight_only.block_size must be a power of two, got {self.block_size}")
        require_bool("weight_only.symmetric", self.symmetric)
        require_choice("weight_only.format", self.format, WEIGHT_ONLY_FORMATS)
        require_bool("weight_only.act_order", self.act_order)
        require_range("weight_only.damping", self.damping, 1e-6, 1.0)
        require_bool("weight_only.quantize_lm_head", self.quantize_lm_head)
        require_bool("weight_only.quantize_embeddings", self.quantize_embeddings)
        require_range("weight_only.accuracy_level", self.accuracy_level, 0, 4, integer=True)

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}
