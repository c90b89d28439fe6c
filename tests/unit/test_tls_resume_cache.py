"""``runtime.tlsresume``: the session cache (keys, tickets, lifetimes, LRU) and the
handshake contexts (lent one at a time, reused, offering the chosen session).

The sessions are real ones, from TLS handshakes over memory BIOs (no socket)."""

from __future__ import annotations

import ssl
from typing import cast

import pytest
import trustme

from mailsluice.runtime.tls import resume as tlsresume
from mailsluice.runtime.tls.resume import ResumeKey, Resumption, SessionCache, Verdict

pytestmark = pytest.mark.unit

KEY = ResumeKey("192.0.2.1", 25, None, "may")
CHAIN = (b"leaf-der", b"intermediate-der")


class _Session:
    """What the cache reads of a session."""

    def __init__(self, has_ticket: bool = True, hint: int = 7200) -> None:
        self.has_ticket = has_ticket
        self.ticket_lifetime_hint = hint


def _session(has_ticket: bool = True, hint: int = 7200) -> ssl.SSLSession:
    return cast(ssl.SSLSession, _Session(has_ticket, hint))


def test_a_session_is_found_by_its_whole_key_only() -> None:
    cache = SessionCache()
    session = _session()
    assert cache.put(KEY, session, CHAIN, now=0.0)
    found = cache.get(KEY, now=1.0)
    assert found is not None
    assert (found.session, found.chain) == (session, CHAIN)
    for other in (
        KEY._replace(address="192.0.2.2"), KEY._replace(port=587),
        KEY._replace(sni="mx.example"), KEY._replace(profile="verify"),
    ):  # fmt: skip
        assert cache.get(other, now=1.0) is None


def test_a_session_without_a_ticket_or_a_chain_is_not_kept() -> None:
    cache = SessionCache()
    assert not cache.put(KEY, _session(has_ticket=False), CHAIN, now=0.0)
    assert not cache.put(KEY, _session(), (), now=0.0)
    assert cache.get(KEY, now=0.0) is None
    assert len(cache) == 0


@pytest.mark.parametrize(
    ("hint", "cap", "lives"),
    [(600, 3600.0, 600.0), (7200, 3600.0, 3600.0), (0, 3600.0, tlsresume.DEFAULT_LIFETIME)],
)
def test_an_entry_lives_as_its_ticket_says_capped(hint: int, cap: float, lives: float) -> None:
    cache = SessionCache(max_lifetime=cap)
    cache.put(KEY, _session(hint=hint), CHAIN, now=100.0)
    assert cache.get(KEY, now=100.0 + lives - 0.001) is not None
    assert cache.get(KEY, now=100.0 + lives) is None
    assert len(cache) == 0  # an expired entry is dropped when found


def test_the_least_recently_used_entry_goes_first() -> None:
    cache = SessionCache(capacity=2)
    keys = [KEY._replace(port=port) for port in (1, 2, 3)]
    cache.put(keys[0], _session(), CHAIN, now=0.0)
    cache.put(keys[1], _session(), CHAIN, now=0.0)
    assert cache.get(keys[0], now=0.0) is not None  # now the most recently used
    cache.put(keys[2], _session(), CHAIN, now=0.0)
    assert [cache.get(k, now=0.0) is not None for k in keys] == [True, False, True]
    assert len(cache) == 2


def test_forget_and_replace() -> None:
    cache = SessionCache()
    first, second = _session(), _session()
    cache.put(KEY, first, CHAIN, now=0.0)
    cache.put(KEY, second, CHAIN, now=0.0)
    found = cache.get(KEY, now=0.0)
    assert found is not None
    assert found.session is second
    cache.forget(KEY)
    cache.forget(KEY)  # forgetting twice is harmless
    assert cache.get(KEY, now=0.0) is None


# ----------------------------------------------------------------- handshake contexts
@pytest.fixture(scope="module")
def server_context() -> ssl.SSLContext:
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("mx.test").configure_cert(context)
    context.maximum_version = ssl.TLSVersion.TLSv1_2  # the ticket comes in the handshake
    return context


def _client_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _handshake(client: ssl.SSLContext, server: ssl.SSLContext) -> ssl.SSLObject:
    """A whole handshake over memory BIOs, as the loops drive one (``wrap_bio``)."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    ours = client.wrap_bio(c_in, c_out, server_side=False, server_hostname="mx.test")
    theirs = server.wrap_bio(s_in, s_out, server_side=True)
    done = [False, False]
    for _ in range(10):
        for index, (obj, out, peer_in) in enumerate(((ours, c_out, s_in), (theirs, s_out, c_in))):
            try:
                obj.do_handshake()
                done[index] = True
            except ssl.SSLWantReadError:
                pass
            peer_in.write(out.read())
        if all(done):
            return ours
    raise AssertionError("the handshake did not finish")


def test_a_lent_context_offers_the_session_and_wraps_with_the_shared_one(
    server_context: ssl.SSLContext,
) -> None:
    shared, resumption = _client_context(), Resumption()
    with resumption.lend(shared, None) as context:
        first = _handshake(context, server_context)
    assert not first.session_reused
    assert first.context is shared
    with resumption.lend(shared, first.session) as again:
        assert again is context  # the free list lends the same context again
        second = _handshake(again, server_context)
    assert second.session_reused
    with resumption.lend(shared, None) as plain:
        assert not _handshake(plain, server_context).session_reused


def test_a_session_of_another_context_means_a_full_handshake(
    server_context: ssl.SSLContext,
) -> None:
    """The client context was replaced: the old sessions cannot be offered with it."""
    resumption = Resumption()
    with resumption.lend(_client_context(), None) as context:
        old = _handshake(context, server_context).session
    with resumption.lend(_client_context(), old) as context:
        assert not _handshake(context, server_context).session_reused


def test_contexts_lent_at_once_are_distinct_and_all_come_back() -> None:
    resumption, shared = Resumption(), _client_context()
    with resumption.lend(shared, None) as one, resumption.lend(shared, None) as two:
        assert one is not two
        assert isinstance(one, ssl.SSLContext)
    with resumption.lend(shared, None) as again:
        assert again in (one, two)
        assert getattr(again, "session", "unset") is None


# ----------------------------------------------------------------- verdicts and refresh
def test_a_resumed_session_is_refreshed_only_past_half_its_life() -> None:
    cache = SessionCache()
    cache.put(KEY, _session(hint=600), CHAIN, now=1000.0)
    found = cache.get(KEY, now=1000.0)
    assert found is not None
    assert (found.refresh, found.expires) == (1300.0, 1600.0)


def test_a_verdict_holds_for_its_verifier_until_the_first_notafter() -> None:
    ca = trustme.CA()
    leaf = ca.issue_cert("mx.test")
    pems = [*leaf.cert_chain_pems, ca.cert_pem]
    ders = tuple(ssl.PEM_cert_to_DER_cert(blob.bytes().decode()) for blob in pems)
    verifier, other = object(), object()
    verdict = Verdict.of(True, verifier, ders)
    assert verdict.until > 0
    assert verdict.holds(verifier, verdict.until - 1)
    assert not verdict.holds(verifier, verdict.until)  # the chain's first certificate expired
    assert not verdict.holds(other, verdict.until - 1)  # another trust store asks again
    assert Verdict.of(True, verifier, (b"not DER",)).until == 0.0  # never reused
    assert Verdict.of(True, verifier, ()).until == 0.0
