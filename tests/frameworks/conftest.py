"""tests/frameworks runs only through `make test-frameworks` (tests/conftest.py leaves it out otherwise).

There every framework must be installed at the version the ``frameworks`` extra pins: a missing
or different one fails the session at collection, never skips a test.
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _pins() -> dict[str, str]:
    block = re.search(r"^frameworks = \[(.*?)\]", PYPROJECT.read_text(), re.S | re.M)
    assert block, "pyproject.toml has no `frameworks` extra"
    return dict(re.findall(r'"([\w-]+)==([\w.]+)"', block.group(1)))


def _check_installed() -> None:
    problems = []
    for name, pinned in _pins().items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"{name} is not installed (the extra pins {pinned})")
            continue
        if installed != pinned:
            problems.append(f"{name} {installed} is installed, the extra pins {pinned}")
    if problems:
        raise pytest.UsageError(
            "tests/frameworks needs the `frameworks` extra (make test-frameworks installs it): " + "; ".join(problems)
        )


_check_installed()
