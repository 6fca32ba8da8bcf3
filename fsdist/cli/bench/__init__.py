"""``python -m fsdist bench``: collectives timed side by side with Gloo, nccl-tests style.

``command`` parses the arguments, spawns the ranks of each world size and reports; ``plan``
chooses sizes and iteration counts; ``ops`` builds, runs and verifies each operation; ``rank``
is what each spawned rank runs; ``report`` turns per-rank timings into the table, CSV, JSON
and the optional plot.
"""
