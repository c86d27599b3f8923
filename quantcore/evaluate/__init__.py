"""Stage 6, evaluate: FP32 against the exported model, as exact Q/DQ and as deployed (``evaluation``),
whether the two agree and what to do when not (``parity``), and CPU latency (``cpu_latency``)."""
