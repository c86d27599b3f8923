"""Stage 3, calibrate: observers fed batch by batch (``calibration``), and the search over clipping
candidates that keeps the one reproducing the FP32 outputs best (``clip_search``), and the empirical
bias correction of the quantized layers (``bias_correction``, when the config asks for it)."""
