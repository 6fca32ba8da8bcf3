"""fsdist never uses the network: no module imports socket, and 4 ranks run with no interfaces."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fsdist

from harness import unshare_works

PACKAGE = Path(fsdist.__file__).parent
REPO = Path(__file__).resolve().parent.parent


def test_no_module_imports_socket() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in ("socket", "socketserver", "ssl")]
    assert not offenders, offenders


@pytest.mark.skipif(not unshare_works(), reason="unshare -n needs root (or user namespaces) and util-linux")
def test_four_ranks_inside_a_network_namespace_with_no_interfaces(tmp_path) -> None:
    script = (  # only a downed loopback: connecting gives ENETUNREACH, not ECONNREFUSED
        "import errno, socket, sys; "
        "code = socket.socket().connect_ex(('127.0.0.1', 9)); "
        "sys.exit(0 if code == errno.ENETUNREACH and len(socket.if_nameindex()) == 1 else 1)"
    )
    check = subprocess.run(["unshare", "-n", sys.executable, "-c", script], capture_output=True)
    assert check.returncode == 0, "the namespace unexpectedly has a working loopback"
    result = subprocess.run(
        ["unshare", "-n", sys.executable, str(REPO / "examples" / "demo.py"), "--ranks", "4", "--steps", "5",
         "--dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all 4 replicas identical" in result.stdout
