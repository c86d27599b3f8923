"""The arithmetic of quantization, shared by calibration, reconstruction, export and evaluation.

``tqc`` (TensorQuantConfig: what one tensor's quantization is), ``policy`` and ``precision`` (its flags and
the recipe's bit widths), ``scaling`` (statistics to scale and offset), ``linear``/``floating``/``rounding``
(the differentiable fake-quant kernels), ``fake_quant`` (a TQC applied to a tensor), ``storage_type`` (the
integer or FP8 type Q/DQ store), ``metrics`` (SQNR, cosine, task metrics)."""
