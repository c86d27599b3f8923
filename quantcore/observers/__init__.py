"""Observers: statistics of a tensor seen batch by batch, turned into a clipping range.

``registry`` names them (``OBSERVERS``) and builds one for a TQC; ``histogram`` streams histograms
(``_binning.c`` bins a batch in one pass); ``clipping`` holds the threshold searches (KL, MSE, FP8)."""
