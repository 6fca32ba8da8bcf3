"""The command table: help lists every command, the longest name leading argv picks the module."""

from __future__ import annotations

import pytest

from fsdist.cli import _COMMANDS, main


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
