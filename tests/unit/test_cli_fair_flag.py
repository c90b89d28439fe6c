"""``mailsluice serve --no-fair-sharing``: the flag must turn fair sharing off.

Found by the fairness benchmark (issue 13): the flag refuses to start with ``configuration
error: fair: unknown setting`` because ``cli.settings_from_args`` hands the value to
``config.settings_from_mapping`` under the key ``fair``, which the mapping reader does not
know (the file's key is ``[fair_sharing] enabled``). Marked xfail (strict) until the CLI is
fixed: the fix turns it into an unexpected pass, which fails the suite so the mark goes.
The benchmarks meanwhile turn fair sharing off with a configuration file
(``[fair_sharing] enabled = false``), which works.
"""

from __future__ import annotations

import pytest

from mailsluice.cli import build_parser, settings_from_args


@pytest.mark.xfail(
    strict=True, reason="cli passes 'fair' to settings_from_mapping, which rejects the key"
)
def test_no_fair_sharing_flag_turns_fair_sharing_off() -> None:
    args = build_parser().parse_args(["serve", "--no-fair-sharing", "--log", "none:"])
    assert settings_from_args(args).fair.enabled is False


def test_fair_sharing_is_on_without_the_flag() -> None:
    args = build_parser().parse_args(["serve", "--log", "none:"])
    assert settings_from_args(args).fair.enabled is True
