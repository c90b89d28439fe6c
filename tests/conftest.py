"""Shared fixtures: the test PKI and TLS contexts; hypothesis profiles.

Hypothesis profiles, chosen with the environment variable ``HYPOTHESIS_PROFILE``: ``dev``
(the default: 10 examples a property, so the unit tier answers in seconds while you
work), ``ci`` (more examples; ``scripts/test``, what CI runs) and ``deep`` (20,000, for a
long hunt). A failure found once is replayed first on the next run (the example
database in ``.hypothesis/``), whatever the profile.
"""

from __future__ import annotations

import gc
import os
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from hypothesis import settings

from mailsluice.settings.logplace import DEFAULT_LOG_DIR
from tests.support import certs

settings.register_profile("dev", max_examples=10, deadline=None)
settings.register_profile("ci", max_examples=200, deadline=None)
settings.register_profile("deep", max_examples=20_000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(scope="session")
def tls_ca() -> trustme.CA:
    """The test CA (one per test session)."""
    return trustme.CA()


@pytest.fixture
def tls_ca_file(tls_ca: trustme.CA, tmp_path: Path) -> str:
    """``tls_ca`` as a PEM file (for ``ca_file`` settings)."""
    path = tmp_path / "ca.pem"
    tls_ca.cert_pem.write_to_path(str(path))
    return str(path)


@pytest.fixture(scope="session")
def mx_cert(tls_ca: trustme.CA) -> trustme.LeafCert:
    """The MX certificate: mx.test, localhost, 127.0.0.1, ::1, issued by ``tls_ca``."""
    return tls_ca.issue_cert(*certs.MX_IDENTITIES)


@pytest.fixture
def server_ssl_context(mx_cert: trustme.LeafCert) -> ssl.SSLContext:
    """A server-side context presenting ``mx_cert``."""
    return certs.server_context(mx_cert)


@pytest.fixture
def client_ssl_context(tls_ca: trustme.CA) -> ssl.SSLContext:
    """A verifying client context trusting ``tls_ca``."""
    return certs.client_context(tls_ca)


@pytest.fixture(scope="session", autouse=True)
def _no_session_log_in_var_lib() -> Iterator[None]:
    """Tests give every log a place of their own (``--log``, ``log=``): none may create the
    default log directory of the machine (/var/lib/mailsluice) by leaving it out."""
    existed = DEFAULT_LOG_DIR.exists()
    yield
    if not existed and DEFAULT_LOG_DIR.exists():
        pytest.fail(f"a test created {DEFAULT_LOG_DIR}: pass an explicit --log / log=")


@pytest.fixture(autouse=True)
def _collect_garbage_after_each_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """A leaked socket, file or event loop warns (ResourceWarning, an error here) when it
    is collected: collect after each test that is not a pure unit test, so the warning
    names the test that leaked it, not whichever test ran when the collector did."""
    yield
    if request.node.get_closest_marker("unit") is None:
        gc.collect()


def pytest_collection_finish(session: pytest.Session) -> None:
    """What exists once the tests are collected (the modules, their constants) lives to the
    end: frozen out of the collector's way, the collection after each test walks only what
    the tests made since (about 35 ms a test before, a minute of the suite)."""
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``swaps_code`` tests replace a method or function of code mypyc compiles (a spy, a
    planted fault): compiled code calls its own code directly, so the swap reaches nothing.
    They are skipped against the compiled build and run in ``scripts/test``'s pass on the
    Python sources (``MAILSLUICE_PURE=1 pytest -m swaps_code``)."""
    from mailsluice import native

    if native.build() != "compiled":
        return
    skip = pytest.mark.skip(reason="swaps compiled code: run in the pure build's pass")
    for item in items:
        if item.get_closest_marker("swaps_code") is not None:
            item.add_marker(skip)
