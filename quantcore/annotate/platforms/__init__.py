"""Platform rule sets, by the name ``QuantizeConfig.platform`` uses (one module per platform).

tensorrt      INT8, TensorRT explicit quantization           quantcore.annotate.platforms.tensorrt
tensorrt-fp8  FP8 E4M3, TensorRT 10                           quantcore.annotate.platforms.tensorrt_fp8
onnxruntime   QDQ for the ONNX Runtime CPU EP's int kernels   quantcore.annotate.platforms.onnxruntime
onnxruntime-dynamic  MatMuls with run-time activation ranges  quantcore.annotate.platforms.onnxruntime_dynamic
onnxruntime-weight-only  4/8-bit blockwise MatMul/Gemm weights, float activations
                                                              quantcore.annotate.platforms.onnxruntime_weight_only
academic      2-8 bit research protocol                       quantcore.annotate.platforms.academic
"""

from __future__ import annotations

from quantcore.annotate.platforms.academic import ACADEMIC
from quantcore.annotate.platforms.onnxruntime import ONNXRUNTIME
from quantcore.annotate.platforms.onnxruntime_dynamic import ONNXRUNTIME_DYNAMIC
from quantcore.annotate.platforms.onnxruntime_weight_only import ONNXRUNTIME_WEIGHT_ONLY
from quantcore.annotate.platforms.tensorrt import TENSORRT
from quantcore.annotate.platforms.tensorrt_fp8 import TENSORRT_FP8
from quantcore.annotate.rules import Platform
from quantcore.config import PlatformName

PLATFORMS: dict[PlatformName, Platform] = {
    p.name: p for p in (TENSORRT, TENSORRT_FP8, ONNXRUNTIME, ONNXRUNTIME_DYNAMIC, ONNXRUNTIME_WEIGHT_ONLY, ACADEMIC)
}

__all__ = ["PLATFORMS", "Platform"]
