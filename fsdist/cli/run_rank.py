"""``python -m fsdist.cli.run_rank SCRIPT ARGS...``: how the launcher starts each rank.

Runs SCRIPT as ``__main__`` and, if it raises, writes the exception (type, message,
traceback, time) as JSON to ``$FSDIST_ERROR_FILE`` before exiting non-zero, so the launcher can
report the *first* failing rank with its traceback rather than whichever died last.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
import traceback

from ..files.io import publish
from ..protocol import failure_report


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m fsdist.cli.run_rank SCRIPT [ARGS...]")
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            _record(exc)
        raise
    except BaseException as exc:
        _record(exc)
        raise


def _record(exc: BaseException) -> None:
    path = os.environ.get("FSDIST_ERROR_FILE")
    if not path:
        return
    report = failure_report.encode(
        {
            "rank": int(os.environ.get("RANK", "-1")),
            "type": type(exc).__name__,
            "message": str(exc),
            "traceback": traceback.format_exc(),
            "time": time.time(),
        }
    )
    publish(os.path.dirname(path), os.path.basename(path), [report])  # complete or absent, never followed


if __name__ == "__main__":
    main()
