"""Reading the original destination: errors name their cause."""

from __future__ import annotations

import errno

import pytest

from mailsluice.runtime.net import origdst
from mailsluice.runtime.net.origdst import OriginalDestinationError

pytestmark = pytest.mark.integration


class _NoName:
    def getsockname(self) -> object:
        raise OSError(errno.ENOTCONN, "not connected")

    def getsockopt(self, *args: object) -> bytes:
        raise AssertionError("getsockopt must not be called")


def test_original_destination_errors_name_the_cause() -> None:
    with pytest.raises(OriginalDestinationError) as gone:
        origdst.original_destination(_NoName())  # type: ignore[arg-type]
    assert gone.value.errno == errno.ENOTCONN
    assert "the client closed the connection before its destination was read" in str(gone.value)
    other = origdst.explain(errno.EPERM, "SO_ORIGINAL_DST")
    assert other == "SO_ORIGINAL_DST: EPERM (1) reading the original destination"
    with pytest.raises(OriginalDestinationError, match="has no IP local address") as bad:
        origdst.uses_ipv4_call("/run/mailsluice.sock")
    assert bad.value.errno == errno.EINVAL
