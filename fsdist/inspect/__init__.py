"""Layer 6: reading a live or dead run directory from outside the job: who the ranks are, where
each one is, who holds whom up (behind ``fsdist status``).
"""
