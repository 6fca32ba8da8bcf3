"""Layer 1: the file primitives every other layer stands on: atomic publish, fcntl-locked records
and counters, waits with deadlines, doorbells. Knows nothing of jobs or tensors.
"""
