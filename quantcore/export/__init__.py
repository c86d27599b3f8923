"""Stage 5, export: the original graph with QuantizeLinear/DequantizeLinear inserted (``qdq``), and the
checkpoint a resumed run reuses (``checkpoint``)."""
