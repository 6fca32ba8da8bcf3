"""The command table: help lists every command, the longest name leading argv picks the module."""

from __future__ import annotations

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
    assert main(["run", "--nproc-per-node", "1", "--dir", str(tmp_path), "train.py", "--bogus", "x"]) == 0
    assert seen["args"].script == "train.py" and seen["args"].script_args == ["--bogus", "x"]
