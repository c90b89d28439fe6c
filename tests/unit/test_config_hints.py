"""A key the configuration does not know is refused with what it probably meant, and a
``hold_max`` that the MSAs would not wait for is refused with the reason (issue 23)."""

from __future__ import annotations

from typing import Any

import pytest

from mailsluice.settings.config import TOP_KEYS, ConfigError, settings_from_mapping

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"timeout": {"connect": 3}}, "timeout: unknown setting; did you mean [timeouts]?"),
        ({"max_recipient": 5}, "max_recipient: unknown setting; did you mean 'max_recipients'?"),
        ({"tenant": []}, "tenant: unknown setting; did you mean [[tenants]]?"),
        ({"hold_max": 60}, "hold_max: unknown setting; hold_max is set in [fair_sharing]"),
        ({"fair_sharing": {"holdmax": 60}}, "fair_sharing.holdmax: unknown key; did you mean "
         "'hold_max'?"),
        ({"tls_policy": {"resolve": "127.0.0.1"}}, "tls_policy.resolve: unknown key; did you "
         "mean 'resolver'?"),
        ({"destinations": [{"match": "10.0.0.0/8", "max_connection": 3}]},
         "destinations[0]: unknown key 'max_connection'; did you mean 'max_connections'?"),
        ({"filtering": {"timout": 3}}, "filtering.timout: unknown setting; did you mean "
         "'timeout'?"),
    ],
)  # fmt: skip
def test_an_unknown_key_names_the_one_meant(data: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigError) as error:
        settings_from_mapping(data)
    assert str(error.value).startswith(said), str(error.value)


def test_hold_max_under_timeouts_is_refused_naming_its_table() -> None:
    """It used to be accepted there, and ignored (the relay takes fair_sharing's)."""
    with pytest.raises(ConfigError) as error:
        settings_from_mapping({"timeouts": {"hold_max": 60}})
    assert str(error.value).startswith(
        "timeouts.hold_max: unknown timeout; hold_max is set in [fair_sharing] "
        "(fair_sharing.hold_max)"
    )


def test_a_hold_max_the_msas_would_not_wait_for_is_refused() -> None:
    assert settings_from_mapping({"fair_sharing": {"hold_max": 250}}).fair.hold_max == 250
    with pytest.raises(ConfigError) as error:
        settings_from_mapping({"fair_sharing": {"hold_max": 400}})
    said = str(error.value)
    assert said.startswith("fair_sharing.hold_max: 400 s is too long")
    assert "Postfix's smtp_mail_timeout" in said
    assert "at most 250" in said


def test_every_key_the_hints_know_is_a_key() -> None:
    """The hints' list of top-level keys holds none the parser refuses as unknown."""
    unknown = []
    for key in TOP_KEYS:
        try:
            settings_from_mapping({key: object()})
        except ConfigError as error:  # (a value of the wrong type: said, and fine here)
            if "unknown setting" in str(error):
                unknown.append(key)
        except (TypeError, ValueError, AttributeError):
            pass
    assert unknown == []
