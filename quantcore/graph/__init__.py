"""The ONNX graph as quantcore reads and edits it: an index of producers and consumers (``index``), protobuf
sizes and skeletons (``protobuf``), and Casts at a model's edges (``edges``). Below every stage."""
