"""HTTP front end: validate, persist, enqueue, read back, stream progress."""
