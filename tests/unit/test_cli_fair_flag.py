"""``mailsluice serve --no-fair-sharing``: the flag turns fair sharing off (the benchmarks'
``mailsluice-fcfs`` variant depends on it; it once failed with "fair: unknown setting")."""

from __future__ import annotations

from mailsluice.cli.main import build_parser, settings_from_args


def test_no_fair_sharing_flag_turns_fair_sharing_off() -> None:
    args = build_parser().parse_args(["serve", "--no-fair-sharing", "--log", "none:"])
    assert settings_from_args(args).fair.enabled is False


def test_fair_sharing_is_on_without_the_flag() -> None:
    args = build_parser().parse_args(["serve", "--log", "none:"])
    assert settings_from_args(args).fair.enabled is True
