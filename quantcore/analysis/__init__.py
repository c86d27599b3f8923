"""Where the error comes from, and what to keep float: per-tensor and per-layer error (``ranking``
drives ``switch``, ``graphwise``, ``cones``, ``ranges``), and the accuracy target (``accuracy_target``)."""
