"""The one check of a ``DIR`` argument every diagnostic command makes before it reads anything."""

from __future__ import annotations

import os

__all__ = ["USAGE_ERROR", "directory_problem"]

#: the exit status of a command given something it cannot use (argparse's, and torchrun's)
USAGE_ERROR = 2


def directory_problem(command: str, path: str, wanted: str) -> str | None:
    """The one-line usage error for ``path`` where ``command`` wants a directory (``wanted``
    says which), or None where it is one. Nothing is created or adopted here: the checks of
    ownership and mode come after, where the directory is opened."""
    if not os.path.lexists(path):
        return f"fsdist {command}: {path} does not exist: {wanted}"
    if not os.path.isdir(path):
        kind = "a file" if os.path.isfile(path) else "a device, socket or pipe"
        return f"fsdist {command}: {path} is {kind}, not a directory: {wanted}"
    return None
