"""TLS session resumption toward the MX, with asyncio's ``start_tls`` (which takes no session).

Both loops build the ``SSLObject`` of a STARTTLS handshake with
``sslcontext.wrap_bio(incoming, outgoing, server_side=..., server_hostname=...)``:
asyncio's within ``start_tls`` (its ``SSLProtocol``'s constructor), uvloop's in a callback
that ``start_tls`` schedules and that runs in the *transport's* ``contextvars`` context
(captured when the connection was made), so a context variable set around ``start_tls``
is not seen there. What works on both is a context of our own per
handshake: ``HandshakeContext`` is an ``ssl.SSLContext`` (the loops check that) whose
``wrap_bio`` wraps with the proxy's one client context (``shared``) and the session chosen
for this handshake. A session only resumes on the context that made it, which is why the
wrapping is delegated. A new ``SSLContext`` costs ~0.2 ms (OpenSSL 3), so the handshake
contexts are kept in a free list and lent for one ``start_tls`` at a time (``lend``): a
loop calls ``wrap_bio`` before ``start_tls`` returns, or never (a cancelled ``start_tls``
cancels its callback), so a returned context is not used again by the old handshake.

``SessionCache`` keeps one session per ``ResumeKey`` (MX address, port, SNI, the caller's
profile, e.g. the policy level the handshake is made for), so a session is never offered
to another name or under another policy. It keeps the chain the full handshake presented
with it: a resumed handshake presents no chain, and the same session proves the same peer,
so the checks are made on that chain (``Remembered.chain``). With TLS 1.3 the ticket comes
after the handshake, with the first read: sessions are stored after the MX's first reply
over TLS (``MxLeg.tls_settled``), and only with a ticket. The cache is an LRU of bounded
size; an entry lives as long as the ticket's lifetime hint says, capped.

CPython's ``ssl`` copies a session each time one is read (``SSLObject.session``) or offered
(``wrap_bio(session=...)``): a DER round trip that parses the peer's certificate again,
~0.25 ms with OpenSSL 3.0, as much as a resumed handshake itself. So a resumed handshake's
session is read only once the remembered one is past half its life (``Remembered.refresh``;
servers that issue tickets with OpenSSL accept a ticket more than once). And the chain's
verification (``ChainVerifier``, ~0.25 ms) is kept with the session (``Verdict``): the same
chain, the same verifier, before the chain's first notAfter, give the same answer.
"""

from __future__ import annotations

import ssl
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["HandshakeContext", "Remembered", "ResumeKey", "Resumption", "SessionCache", "Verdict"]

DEFAULT_CAPACITY = 2048
MAX_LIFETIME = 3600.0  # seconds: the longest a session is offered, whatever its hint
DEFAULT_LIFETIME = 300.0  # a ticket without a lifetime hint (TLS 1.2 allows 0)
MAX_FREE_CONTEXTS = 64


class ResumeKey(NamedTuple):
    """What a session may be offered to again: the same MX, name and policy."""

    address: str
    port: int
    sni: str | None
    profile: str


@dataclass(frozen=True, slots=True)
class Remembered:
    """A resumable session, with what the full handshake that made it showed."""

    session: ssl.SSLSession
    chain: tuple[bytes, ...]  # DER, leaf first
    expires: float  # monotonic time
    refresh: float  # monotonic time: from then on, a resumed handshake's session replaces it
    verdict: Verdict | None = None  # the chain's verification, while it holds


@dataclass(frozen=True, slots=True)
class Verdict:
    """A chain's verification by one verifier, true until the first certificate expires
    (a verification depends on the chain, the trust store and the time, nothing else)."""

    verified: bool
    verifier: object  # the ``ChainVerifier`` that said so (another one asks again)
    until: float  # wall-clock time: the earliest notAfter of the chain

    @classmethod
    def of(cls, verified: bool, verifier: object, chain: tuple[bytes, ...]) -> Verdict:
        from cryptography import x509  # (lazily: a worker without TLS to an MX never needs it)

        try:
            until = min(
                x509.load_der_x509_certificate(der).not_valid_after_utc.timestamp() for der in chain
            )
        except ValueError:  # unreadable (or no chain): never reused
            until = 0.0
        return cls(verified, verifier, until)

    def holds(self, verifier: object, now: float) -> bool:
        return verifier is self.verifier and now < self.until


class SessionCache:
    """The sessions to offer, by key: LRU, ``capacity`` entries, each until it expires."""

    def __init__(
        self, capacity: int = DEFAULT_CAPACITY, max_lifetime: float = MAX_LIFETIME
    ) -> None:
        self._entries: OrderedDict[ResumeKey, Remembered] = OrderedDict()
        self._capacity = capacity
        self._max_lifetime = max_lifetime

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: ResumeKey, now: float) -> Remembered | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires <= now:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry

    def put(
        self,
        key: ResumeKey,
        session: ssl.SSLSession,
        chain: tuple[bytes, ...],
        now: float,
        verdict: Verdict | None = None,
    ) -> bool:
        """Remember ``session`` for ``key`` if it can resume (it has a ticket)."""
        if not session.has_ticket or not chain:
            return False
        hint = float(session.ticket_lifetime_hint)
        lifetime = min(hint if hint > 0 else DEFAULT_LIFETIME, self._max_lifetime)
        self._entries[key] = Remembered(session, chain, now + lifetime, now + lifetime / 2, verdict)
        self._entries.move_to_end(key)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)
        return True

    def forget(self, key: ResumeKey) -> None:
        self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()


class HandshakeContext(ssl.SSLContext):
    """One handshake's context: wraps with ``shared`` and the session chosen for it."""

    shared: ssl.SSLContext
    session: ssl.SSLSession | None

    def wrap_bio(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        offered = session if session is not None else self.session
        try:
            return self.shared.wrap_bio(
                incoming, outgoing, server_side=server_side, server_hostname=server_hostname,
                session=offered,
            )  # fmt: skip
        except ValueError:  # a session of another context (replaced): a full handshake
            if offered is None:
                raise
            return self.shared.wrap_bio(
                incoming, outgoing, server_side=server_side, server_hostname=server_hostname
            )


class Resumption:
    """The proxy's session cache and the handshake contexts that offer its sessions (one
    per worker)."""

    def __init__(self, cache: SessionCache | None = None) -> None:
        self.cache = cache if cache is not None else SessionCache()
        self._free: list[HandshakeContext] = []

    @contextmanager
    def lend(
        self, shared: ssl.SSLContext, session: ssl.SSLSession | None
    ) -> Iterator[ssl.SSLContext]:
        """A context for one ``start_tls``: it wraps with ``shared`` (the proxy's client
        context, which made the sessions) and offers ``session`` (None: a full handshake)."""
        context = self._free.pop() if self._free else self._new_context()
        context.shared, context.session = shared, session
        try:
            yield context
        finally:
            context.session = None
            if len(self._free) < MAX_FREE_CONTEXTS:
                self._free.append(context)

    def _new_context(self) -> HandshakeContext:
        context = HandshakeContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False  # as the shared one: ``wrap_bio`` is its
        context.verify_mode = ssl.CERT_NONE
        context.session = None
        return context
