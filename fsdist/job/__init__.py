"""Layer 3: a job's life in a run directory: forming a generation (rendezvous, or claiming one
agreed through a torch store), liveness of its members, leaving, cleaning up after a dead one.
"""
