"""Stage 1, prepare: the model as given made ready to quantize, computing the same function.

``preparation.prepare`` drives it: opset (``opset``), shapes (``shapes``), constant and sample branches
(``branches``), BatchNormalization folding (``folding``), padding (``padding``), half precision widened
to float32 (``half_precision``), regions that stay float (``float_regions``), attention positions
(``attention``). ``validate`` inspects an upload before any job. ``equalization``: cross-layer
equalization of the prepared model, run by the pipeline when the config asks for it."""
