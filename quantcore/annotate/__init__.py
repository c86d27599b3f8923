"""Stage 2, annotate: which tensors are quantized and how, as a TensorQuantConfig per tensor.

``rules`` holds the rule functions per op type; ``platforms`` the rule sets and presets of each target
runtime (``PLATFORMS``); ``annotation`` walks the graph with them."""
