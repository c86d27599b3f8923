"""Statistics the benchmarks print beside their figures: ``significance`` (bootstrap intervals of an SQNR
and of the difference between two methods' SQNRs)."""
