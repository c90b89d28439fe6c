"""The settings' one error class and their validators written once (``settings.values``)."""

from __future__ import annotations

from typing import Any

import pytest

from mailsluice.settings.config import ConfigError, settings_from_mapping
from mailsluice.settings.fair import FairConfigError
from mailsluice.settings.filters import PluginConfigError
from mailsluice.settings.fleet import SharedStateError
from mailsluice.settings.sources import SourceConfigError
from mailsluice.settings.tls import TlsConfigError
from mailsluice.settings.values import SettingsError, network, number, only, tables


@pytest.mark.parametrize(
    "error",
    [ConfigError, FairConfigError, PluginConfigError, SharedStateError, SourceConfigError,
     TlsConfigError],
)  # fmt: skip
def test_every_settings_error_is_a_settings_error(error: type[Exception]) -> None:
    assert issubclass(error, SettingsError)
    assert issubclass(error, ValueError)  # (what callers caught before)


@pytest.mark.parametrize(
    ("data", "names"),
    [
        ({"fair_sharing": {"hold_max": -1}}, "fair_sharing.hold_max"),
        ({"tls_policy": {"resolvr": "127.0.0.1"}}, "tls_policy.resolvr"),
        ({"source_addresses": [{"pool": "a", "adress": "192.0.2.1"}]}, "source_addresses[0]"),
        ({"shared_state": "http://x"}, "shared_state"),
        ({"filtering": {"memory_limit": -1}}, "filtering.memory_limit"),
    ],
)
def test_a_part_s_error_reaches_the_caller_as_a_config_error(
    data: dict[str, Any], names: str
) -> None:
    with pytest.raises(ConfigError, match=names.replace("[", r"\[").replace(".", r"\.")):
        settings_from_mapping(data)


@pytest.mark.parametrize(
    ("raw", "integer", "said"),
    [
        (-1, False, "k: expected a number of at least 0, got -1"),
        ("5", False, "k: expected a number of at least 0, got '5'"),
        (True, False, "k: expected a number of at least 0, got True"),
        (2.5, True, "k: expected a whole number of at least 0, got 2.5"),
    ],
)
def test_a_number_says_what_is_expected_and_what_was_given(
    raw: object, integer: bool, said: str
) -> None:
    with pytest.raises(FairConfigError) as caught:
        number(raw, "k", integer=integer, error=FairConfigError)
    assert str(caught.value) == said
    assert number(3, "k", minimum=1, integer=integer) == 3


def test_a_network_an_unknown_key_and_an_array_of_tables() -> None:
    assert str(network(" 10.0.0.1/8 ", "k", error=SettingsError)) == "10.0.0.0/8"
    with pytest.raises(SourceConfigError, match="k: 'x' is not an address or network"):
        network("x", "k", error=SourceConfigError)
    with pytest.raises(TlsConfigError, match=r"t: unknown key 'colour'.* \(known: a, b\)"):
        only({"colour": 1}, "t", {"a", "b"}, error=TlsConfigError, list_known=True)
    assert tables(None, "k", error=SettingsError) == []
    with pytest.raises(SettingsError, match=r"k: expected an array of tables \(\[\[k\]\]"):
        tables({"a": 1}, "k", error=SettingsError)
