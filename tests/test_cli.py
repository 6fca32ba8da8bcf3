"""The command table: help lists every command, the longest name leading argv picks the module."""

from __future__ import annotations

import os

import pytest

from fsdist.cli.main import _COMMANDS, main


def test_help_lists_every_command_and_no_command_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as help_exit:
        main(["--help"])
    assert help_exit.value.code == 0
    listed = capsys.readouterr().out
    for name, _, help_text in _COMMANDS:
        assert name in listed and help_text[:30] in listed, name
    with pytest.raises(SystemExit) as usage_exit:
        main([])
    assert usage_exit.value.code == 2
    with pytest.raises(SystemExit):
        main(["no-such-command"])
    assert "invalid choice" in capsys.readouterr().err


def test_a_two_word_command_wins_over_its_first_word(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "locks", "--help"])
    assert capsys.readouterr().out.startswith("usage: fsdist bench locks")
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    assert capsys.readouterr().out.startswith("usage: fsdist bench [-h]")


@pytest.mark.parametrize(
    "argv",
    [
        ["--rdzv-backend", "c10d", "--nproc-per-node", "4", "--dir", "D", "train.py"],  # torchrun's habit
        ["--nproc-per-node", "4", "--dir", "D", "--bogus=1", "train.py"],
        ["--nproc-per-node=4", "--bogus", "--dir", "D", "train.py"],
    ],
)
def test_run_names_an_unknown_option_before_the_script(capsys, argv) -> None:
    with pytest.raises(SystemExit) as usage_exit:
        main(["run", *argv])
    assert usage_exit.value.code == 2
    err = capsys.readouterr().err
    unknown = next(a for a in argv if a.startswith(("--rdzv", "--bogus"))).split("=")[0]
    assert f"unknown option {unknown}" in err, err
    assert "required" not in err, err


def test_run_passes_options_after_the_script_to_the_script(tmp_path, monkeypatch) -> None:
    from fsdist.cli import run as launcher

    seen = {}
    monkeypatch.setattr(launcher, "run", lambda args: seen.setdefault("args", args) and 0)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    assert main(["run", "--nproc-per-node", "1", "--dir", str(tmp_path), "train.py", "--bogus", "x"]) == 0
    assert seen["args"].script == "train.py" and seen["args"].script_args == ["--bogus", "x"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--nproc-per-node", "0", "--dir", "D", "t.py"], "--nproc-per-node must be 1 or more, not 0"),
        (["--nproc-per-node", "-1", "--dir", "D", "t.py"], "--nproc-per-node must be 1 or more, not -1"),
        (["--nproc-per-node", "2", "--nnodes", "0", "--dir", "D", "t.py"], "--nnodes must be 1 or more, not 0"),
        (["--nproc-per-node", "2", "--node-rank", "-1", "--dir", "D", "t.py"], "--node-rank must be 0 or more"),
        (["--nproc-per-node", "2", "--max-restarts", "-1", "--dir", "D", "t.py"], "--max-restarts must be 0 or more"),
        (["t.py", "--nproc-per-node", "2", "--dir", "D"], "--nproc-per-node and --dir came after the script"),
        (["--dir", "D", "t.py", "--nproc_per_node=2"], "--nproc-per-node came after the script"),
    ],
)
def test_run_refuses_counts_that_start_nothing_and_options_after_the_script(capsys, argv, says) -> None:
    """Paper cuts (issue 36): ``--nproc-per-node 0`` ran nothing and exited 0; options after the
    script were "required" options, with no word of where they belong."""
    with pytest.raises(SystemExit) as usage_exit:
        main(["run", *argv])
    assert usage_exit.value.code == 2
    assert says in capsys.readouterr().err


def test_run_takes_torchruns_underscore_spellings(tmp_path, monkeypatch) -> None:
    from fsdist.cli import run as launcher

    seen = {}
    monkeypatch.setattr(launcher, "run", lambda args: seen.setdefault("args", args) and 0)
    argv = ["--nproc_per_node", "3", "--node_rank=1", "--nnodes", "2", "--max_restarts", "1", "--dir", str(tmp_path)]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    assert main(["run", *argv, "train.py", "--dir", "theirs"]) == 0
    args = seen["args"]
    assert (args.nproc_per_node, args.node_rank, args.max_restarts) == (3, 1, 1)
    assert args.script_args == ["--dir", "theirs"]  # the script's own --dir stays the script's


def test_run_names_the_node_rank_outside_the_nodes(tmp_path, capsys) -> None:
    script = tmp_path.parent / f"{tmp_path.name}-t.py"
    script.write_text("")
    argv = ["run", "--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "2", "--dir", str(tmp_path), str(script)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--node-rank 2 is not a node of 2" in err and "0 to 1" in err, err
    assert not os.listdir(tmp_path), "nothing may be started or made"


def test_run_without_arguments_names_what_is_required_and_nothing_else(capsys) -> None:
    """Paper cut (issue 36): the script's own arguments were listed as required."""
    with pytest.raises(SystemExit) as usage_exit:
        main(["run"])
    assert usage_exit.value.code == 2
    err = capsys.readouterr().err
    assert err.rstrip().endswith("the following arguments are required: --nproc-per-node/--nproc_per_node, --dir, "
                                 "script"), err  # fmt: skip


def test_doctor_clean_and_status_name_a_missing_path_and_make_nothing(tmp_path, capsys) -> None:
    """Paper cuts (issue 36, 9-10): doctor made a missing directory and called it safe; its errors
    ended with a line of fsdist's source; status called a missing path "not a directory"."""
    missing = tmp_path / "missing"
    assert main(["doctor", str(missing)]) == 2
    assert f"{missing} does not exist" in capsys.readouterr().err
    assert main(["doctor", str(tmp_path), "--peer-mount", str(missing)]) == 2
    assert f"{missing} does not exist" in capsys.readouterr().err
    assert main(["clean", str(missing)]) == 2
    assert f"{missing} does not exist: nothing to clean" in capsys.readouterr().err
    assert main(["status", str(missing)]) == 2
    err = capsys.readouterr().err  # (it named the path twice: "cannot read X: X does not exist")
    assert err.count(str(missing)) == 1 and f"{missing} does not exist" in err, err
    assert not missing.exists()
    afile = tmp_path / "afile"
    afile.write_text("")
    for command in ("doctor", "status", "clean"):
        # a usage error alike for all three; not "another user put it there" for one's own file
        assert main([command, str(afile)]) == 2
        err = capsys.readouterr().err
        assert err == f"fsdist {command}: {afile} is a file, not a directory: " + err.split(": ", 2)[2], err
        assert "another user" not in err and "(in " not in err and len(err.strip().splitlines()) == 1, err


def test_run_refuses_a_missing_script_before_any_rank_starts(tmp_path, capsys) -> None:
    """Paper cut (issue 36, 5): the ranks started anyway, then 28 lines of FileNotFoundError."""
    with pytest.raises(SystemExit) as usage_exit:
        main(["run", "--nproc-per-node", "2", "--dir", str(tmp_path / "run"), str(tmp_path / "nope.py")])
    assert usage_exit.value.code == 2
    assert f"no script {tmp_path / 'nope.py'}" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
