"""``runtime.errors.close``: a TLS transport that refuses ``close()`` is aborted."""

from __future__ import annotations

import pytest

from mailsluice.runtime import errors

pytestmark = pytest.mark.unit


class _Unwrapped:
    """A TLS transport whose peer ended TLS first: close() raises, as asyncio's does."""

    def __init__(self) -> None:
        self.aborted = False

    def close(self) -> None:
        raise RuntimeError("cannot switch state from SSLProtocolState.UNWRAPPED to SHUTDOWN")

    def abort(self) -> None:
        self.aborted = True


def test_a_transport_that_refuses_close_is_aborted() -> None:
    transport = _Unwrapped()
    errors.close(transport)  # type: ignore[arg-type]
    assert transport.aborted
