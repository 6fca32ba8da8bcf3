"""Layer 7: ``python -m fsdist``: one module per command, named as the command (run, status, clean,
doctor, bench, bench locks).
"""
