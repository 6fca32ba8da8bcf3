"""Layer 2: the on-disk protocol as code: every run-directory name and every file format (message,
state record, rendezvous record), imported by every reader and writer. docs/protocol.md
specifies it.
"""
