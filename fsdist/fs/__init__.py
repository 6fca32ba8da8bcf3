"""Layer 2: what the filesystem under a run directory is and whether fsdist is safe on it: mount
facts, the start-up guard, measurements (doctor).
"""
