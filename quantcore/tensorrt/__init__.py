"""Stage 7, the TensorRT engine (GPU workers): ``engine.build_engine`` drives the static Q/DQ rule checks
(``qdq_rules``), profiles, timing cache, the build (``build``: the one module importing ``tensorrt``),
layer precisions, the comparison with ONNX Runtime, GPU latency and metadata."""
