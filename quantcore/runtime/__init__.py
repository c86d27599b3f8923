"""ONNX Runtime as quantcore drives it: sessions (``session``), samples cut into batches along each
input's batch axis (``batching``), the memory a run needs (``memory_plan``), torch threads and the CPU's
integer-kernel features (``threads``, ``cpu_features``)."""
