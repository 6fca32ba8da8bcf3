"""Every example of examples/primitives runs through the launcher and checks its own result."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PRIMITIVES = Path(__file__).resolve().parent.parent / "examples" / "primitives"
EXAMPLES = sorted(p.stem for p in PRIMITIVES.glob("*.py") if not p.stem.startswith("_") and p.stem != "all")


def _launch(directory: Path, ranks: int, script: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "fsdist", "run", "--nproc-per-node", str(ranks), "--dir", str(directory)]
    return subprocess.run([*command, str(PRIMITIVES / script)], capture_output=True, text=True, timeout=300)


def test_all_examples_in_one_four_rank_job(tmp_path) -> None:
    done = _launch(tmp_path, 4, "all.py")
    assert done.returncode == 0, done.stdout + done.stderr
    for name in EXAMPLES:
        assert f"[rank 0] {name}: OK" in done.stdout, done.stdout
    assert "[rank 0] all: OK on 4 ranks" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == [".launch", "fsdist-rendezvous.json"]


def test_all_lists_every_example_and_each_runs_as_a_script() -> None:
    for name in EXAMPLES:
        text = (PRIMITIVES / f"{name}.py").read_text()
        assert text.rstrip().endswith('if __name__ == "__main__":\n    main(run)'), name
        assert f"examples/primitives/{name}.py" in text, f"{name}: its docstring should show the command"
    tree = ast.parse((PRIMITIVES / "all.py").read_text())
    (listed,) = [
        ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "EXAMPLES"
    ]
    assert sorted(listed) == EXAMPLES


# each launch costs several seconds of rank start-up, so only two run alone: a point-to-point
# one and the group one; all.py above runs every example's checks through the same main()
@pytest.mark.parametrize("name", ["send_recv", "groups"])
def test_an_example_runs_alone_in_one_command(tmp_path, name) -> None:
    done = _launch(tmp_path, 2, f"{name}.py")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"[rank 0] {name}: OK on 2 ranks" in done.stdout


def test_the_demo_removes_the_directory_it_made_and_says_how_to_run_the_launcher(tmp_path) -> None:
    """Paper cuts (issue 36, 1 and 11): the demo left its temporary directory behind, and nothing
    said which Python the launcher's commands need (the system's has no torch)."""
    import os

    demo = Path(__file__).resolve().parent.parent / "examples" / "demo.py"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    command = [sys.executable, str(demo), "--ranks", "2", "--steps", "2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("fsdist-demo-")], list(tmp_path.iterdir())
    assert "-m fsdist run --nproc-per-node 4" in done.stdout and "source .venv/bin/activate" in done.stdout
