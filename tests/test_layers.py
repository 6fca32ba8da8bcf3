"""The package tree is the architecture, and a test holds it so.

Each subpackage sits on a layer and imports only from layers below it (or from within itself):

    0  errors, defaults, _version      names every layer shares
    1  files/                          atomic files, fcntl locks, waits, doorbells
    2  protocol/  fs/                  every on-disk name and format; what the filesystem is
    3  job/                            forming a job, liveness, leaving, cleaning
    4  transport/                      one group's channels over files
    5  collectives/                    the algorithms, over a CollectiveChannel
    6  c10d/  inspect/                 the torch adapter; reading a run directory
    7  cli/                            one module per command

The diagnostics (status, doctor, clean, bench locks) must start without torch: their modules and
everything they import stay torch-free, checked both statically and by running them.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import fsdist

PACKAGE = Path(fsdist.__file__).parent
LAYERS = {
    "errors": 0, "defaults": 0, "_version": 0,
    "files": 1,
    "protocol": 2, "fs": 2,
    "job": 3,
    "transport": 4,
    "collectives": 5,
    "c10d": 6, "inspect": 6,
    "cli": 7,
    "__init__": 8, "__main__": 8,  # the package's face: registers lazily, starts the CLI
}  # fmt: skip
#: what the diagnostics load: none of it may import torch
TORCH_FREE = ["files", "fs", "job", "inspect", "protocol/layout.py", "protocol/state_record.py",
              "protocol/rendezvous_record.py", "protocol/sealed.py", "cli/main.py", "cli/status.py", "cli/doctor.py",
              "cli/clean.py", "cli/bench_locks.py", "errors.py", "defaults.py", "__init__.py"]  # fmt: skip


def imports(path: Path) -> list[tuple[str, int]]:
    """(top-level fsdist unit imported, line) for every intra-package import in ``path``."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    package = parts[:-1]  # a module's package; an __init__.py's is its own folder
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(package[: len(package) - (node.level - 1)]) if node.level > 1 else list(package)
            target = [*base, *(node.module.split(".") if node.module else [])]
            names = [target] if node.module else [[*target, alias.name] for alias in node.names]
            found += [(t[0] if t else "__init__", node.lineno) for t in names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fsdist."):
            found.append((node.module.split(".")[1], node.lineno))
    return found


def unit_of(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def violations(modules: dict[str, list[tuple[str, int]]], layers: dict[str, int]) -> list[str]:
    """``modules``: unit of each module file -> its imports. A unit may import its own unit and
    units on lower layers only."""
    problems = []
    for name, found in modules.items():
        unit = name.split("/")[0].removesuffix(".py")
        for target, line in found:
            if target != unit and layers[target] >= layers[unit]:
                problems.append(f"{name}:{line} imports {target} (layer {layers[target]}) from layer {layers[unit]}")
    return problems


def test_no_module_imports_a_layer_above_its_own() -> None:
    modules = {str(p.relative_to(PACKAGE)): imports(p) for p in sorted(PACKAGE.rglob("*.py"))}
    assert set(LAYERS) >= {unit_of(PACKAGE / m) for m in modules}, "a unit with no layer: add it to LAYERS"
    problems = violations(modules, LAYERS)
    assert not problems, "\n".join(problems)


def test_the_layer_check_catches_an_import_from_below() -> None:
    """The check above can fail: a file-layer module importing the transport is caught."""
    fake = {"files/io.py": [("transport", 12)], "transport/group.py": [("files", 3)]}
    assert violations(fake, LAYERS) == ["files/io.py:12 imports transport (layer 4) from layer 1"]


def test_the_diagnostics_modules_import_no_torch() -> None:
    offenders = []
    for entry in TORCH_FREE:
        paths = sorted((PACKAGE / entry).rglob("*.py")) if (PACKAGE / entry).is_dir() else [PACKAGE / entry]
        for path in paths:
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names = [node.module]
                offenders += [f"{path.relative_to(PACKAGE)}: {n}" for n in names if n.split(".")[0] == "torch"]
    assert not offenders, offenders


def test_status_clean_bench_locks_and_doctor_run_without_loading_torch(tmp_path) -> None:
    code = (
        "import sys, runpy\n"
        "sys.argv = ['fsdist'] + sys.argv[1:]\n"
        "try:\n    runpy.run_module('fsdist', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print('TORCH LOADED' if 'torch' in sys.modules else 'no torch')\n"
    )
    where = str(tmp_path)
    commands = [["status", where], ["clean", where], ["status", "--json", where],
                ["bench", "locks", where, "-n", "2", "--seconds", "0.2"], ["doctor", where]]  # fmt: skip
    for command in commands:
        result = subprocess.run([sys.executable, "-c", code, *command], capture_output=True, text=True, timeout=120)
        assert result.stdout.strip().endswith("no torch"), f"{command}: {result.stdout[-500:]} {result.stderr[-500:]}"
