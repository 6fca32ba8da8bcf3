"""``python -m fsdist.cli.run_rank SCRIPT ARGS...``: how the launcher starts each rank.

Runs SCRIPT as ``__main__`` and, if it raises, writes the exception (type, message,
traceback, time) as JSON to ``$FSDIST_ERROR_FILE`` before exiting non-zero, so the launcher can
report the *first* failing rank with its traceback rather than whichever died last.

A rank that fails only because another did (a peer died, or the group broke) prints one line,
not its traceback: one failure would otherwise print a traceback from every rank, and the one
that matters, the first failure's, is the launcher's to print (its report keeps the others').
"""

from __future__ import annotations

import os
import runpy
import sys
import time
import traceback

from ..errors import GroupBrokenError, PeerFailedError
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
    except (PeerFailedError, GroupBrokenError) as exc:
        _record(exc)
        print(f"{_prefix()}{type(exc).__name__}: {exc} (stopped because another rank failed)", file=sys.stderr)
        sys.exit(1)
    except Exception as exc:  # noqa: BLE001 - every error: recorded, then printed as Python would
        _record(exc)
        lines = _script_traceback(exc).splitlines()
        print("\n".join(_prefix() + line for line in lines), file=sys.stderr)  # torch's rank prefix, as under torchrun
        sys.exit(1)
    except BaseException as exc:  # KeyboardInterrupt and the like: Python's own ending
        _record(exc)
        raise


def _prefix() -> str:
    return f"[rank{os.environ.get('RANK', '?')}]: "


def _script_traceback(exc: BaseException) -> str:
    """The traceback from the script's own frames on: this module's and runpy's come first in
    every rank's traceback and say nothing about the script."""
    tb = exc.__traceback__
    while tb is not None and (tb.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>") or
                              tb.tb_frame.f_code.co_filename.endswith("runpy.py")):  # fmt: skip
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _record(exc: BaseException) -> None:
    path = os.environ.get("FSDIST_ERROR_FILE")
    if not path:
        return
    report = failure_report.encode(
        {
            "rank": int(os.environ.get("RANK", "-1")),
            "type": type(exc).__name__,
            "message": str(exc),
            "traceback": _script_traceback(exc),
            "time": time.time(),
        }
    )
    publish(os.path.dirname(path), os.path.basename(path), [report])  # complete or absent, never followed


if __name__ == "__main__":
    main()
