"""``python -m fsdist.cli.run_rank SCRIPT ARGS...``: how the launcher starts each rank.

Runs SCRIPT as ``__main__`` and, if it raises, writes the exception (type, message,
traceback, time) as JSON to ``$FSDIST_ERROR_FILE`` before exiting non-zero, so the launcher can
report the *first* failing rank with its traceback rather than whichever died last.

A rank that fails only because another did (a peer died, or the group broke) prints one line,
not its traceback: one failure would otherwise print a traceback from every rank, and the one
that matters, the first failure's, is the launcher's to print (its report keeps the others').
"""

from __future__ import annotations

import ctypes
import os
import runpy
import signal
import sys
import time
import traceback

from ..defaults import ENV_ERROR_FILE, ENV_LAUNCHER_PID
from ..errors import GroupBrokenError, PeerFailedError
from ..files.io import publish
from ..protocol import failure_report


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m fsdist.cli.run_rank SCRIPT [ARGS...]")
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    _end_with_the_launcher()
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            _record(exc)
        raise
    except Exception as exc:  # noqa: BLE001 - every error: recorded, then printed as Python would
        consequence = _consequence(exc)
        _record(exc, consequence)
        if consequence is not None:
            kind, message = consequence
            print(f"{_prefix()}{kind}: {message} (stopped because another rank failed)", file=sys.stderr)
        else:
            lines = _script_traceback(exc).splitlines()
            print("\n".join(_prefix() + line for line in lines), file=sys.stderr)  # torch's rank prefix, as torchrun's
        sys.exit(1)
    except BaseException as exc:  # KeyboardInterrupt and the like: Python's own ending
        _record(exc)
        raise


def _end_with_the_launcher() -> None:
    """Have the kernel stop this rank (SIGTERM) when its launcher dies: a launcher killed with
    SIGKILL cannot stop its ranks (each runs in a session of its own), which would train on,
    orphaned, holding the run directory. ``FSDIST_LAUNCHER_PID``: the launcher, which may have
    died before the link was made."""
    launcher = os.environ.get(ENV_LAUNCHER_PID, "")
    if not launcher.isdigit():
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) == 0 and os.getppid() != int(launcher):
        os.kill(os.getpid(), signal.SIGTERM)  # it died already


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_CONSEQUENCES = (PeerFailedError, GroupBrokenError)


def _consequence(exc: BaseException) -> tuple[str, str] | None:
    """(kind, message) of the failure of another rank that ``exc`` only passes on, or None.

    torch wraps an error raised in a future's callback (DDP's reducer, a comm hook) in a
    RuntimeError "Got the following error when running the callback: PeerFailedError: ..." and
    drops the chain: the name in the text is all that is left."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, _CONSEQUENCES):
            return type(seen).__name__, str(seen)
        seen = seen.__cause__ or seen.__context__
    text = str(exc)
    for kind in (cls.__name__ for cls in _CONSEQUENCES):
        at = text.find(f"{kind}: ")
        if at >= 0:
            return kind, text[at + len(kind) + 2 :].split("\n")[0]
    return None


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


def _record(exc: BaseException, consequence: tuple[str, str] | None = None) -> None:
    """Write the report the launcher reads (a consequence under its own kind: the launcher
    reports a root cause before it)."""
    path = os.environ.get(ENV_ERROR_FILE)
    if not path:
        return
    kind, message = consequence or (type(exc).__name__, str(exc))
    report = failure_report.encode(
        {
            "rank": int(os.environ.get("RANK", "-1")),
            "type": kind,
            "message": message,
            "traceback": _script_traceback(exc),
            "time": time.time(),
        }
    )
    publish(os.path.dirname(path), os.path.basename(path), [report])  # complete or absent, never followed


if __name__ == "__main__":
    main()
