"""Every command and every option of ``mailsluice`` says what it is for in ``--help``
(issue 23: options without help text)."""

from __future__ import annotations

import argparse

import pytest

from mailsluice.cli.main import build_parser

pytestmark = pytest.mark.unit


def _undocumented(parser: argparse.ArgumentParser, path: str) -> list[str]:
    found: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helped = {choice.dest for choice in action._choices_actions}
            for name, sub in action.choices.items():
                if name not in helped:
                    found.append(f"{path} {name} (the command)")
                found += _undocumented(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction | argparse._VersionAction) and (
            not action.help or action.help == argparse.SUPPRESS
        ):
            found.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    return found


def test_every_command_and_option_has_help() -> None:
    assert _undocumented(build_parser(), "mailsluice") == []
