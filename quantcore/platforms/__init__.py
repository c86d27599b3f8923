"""Platform rule sets, by the name ``QuantizeConfig.platform`` uses (one module per platform).

tensorrt      INT8, TensorRT explicit quantization           quantcore.platforms.tensorrt
tensorrt-fp8  FP8 E4M3, TensorRT 10                           quantcore.platforms.tensorrt_fp8
onnxruntime   QDQ for the ONNX Runtime CPU EP's int kernels   quantcore.platforms.onnxruntime
onnxruntime-dynamic  MatMuls with run-time activation ranges  quantcore.platforms.onnxruntime_dynamic
academic      2-8 bit research protocol                       quantcore.platforms.academic
"""

from __future__ import annotations

from quantcore.platforms.academic import ACADEMIC
from quantcore.platforms.onnxruntime import ONNXRUNTIME
from quantcore.platforms.onnxruntime_dynamic import ONNXRUNTIME_DYNAMIC
from quantcore.platforms.tensorrt import TENSORRT
from quantcore.platforms.tensorrt_fp8 import TENSORRT_FP8
from quantcore.rules import Platform

PLATFORMS: dict[str, Platform] = {
    p.name: p for p in (TENSORRT, TENSORRT_FP8, ONNXRUNTIME, ONNXRUNTIME_DYNAMIC, ACADEMIC)
}

__all__ = ["PLATFORMS", "Platform"]
