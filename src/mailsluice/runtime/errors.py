"""The one place where OS, socket and TLS errors become the relay's events.

The relay knows nothing of exceptions: the shell catches what an operation on the MX
connection raises and hands the relay the fact (httpcore's ``map_exceptions`` pattern).

* Dialling: a shortage of our own (descriptors, buffers, memory) is our fault, so
  ``InternalError`` (``421 4.3.0``), not "destination unreachable"; a timeout or any
  other socket error is ``ServerConnectFailed`` (``421 4.4.1``).
* The TLS handshake with the MX: any failure is ``TlsFailed`` (``421 4.7.5``; the
  destination is remembered as one whose TLS is broken).
* The client's TLS handshake (its STARTTLS): any failure, its timeout too, is
  ``ClientTlsFailed`` (the relay closes the connection).
* A bug of ours (an exception from the relay or from a job) is ``InternalError``
  (``421 4.3.0`` for that connection, never a crash and never a 2xx).
* A write the MX does not take within its deadline is ``ServerClosed``.
* Closing: a TLS transport whose peer already ended TLS (its close_notify read, in the
  middle of our own callback) refuses ``close()`` with a ``RuntimeError``; ``close``
  aborts it then.
"""

from __future__ import annotations

import asyncio
import errno
import ssl

from mailsluice.relay import events as ev

__all__ = [
    "CLIENT_TLS_ERRORS", "DIAL_ERRORS", "LOCAL_SHORTAGE", "TLS_ERRORS", "client_tls_failed",
    "close", "dial_failed", "internal_error", "tls_failed", "write_timed_out",
]  # fmt: skip

#: errors that mean a shortage here, not a problem of the destination
LOCAL_SHORTAGE = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

#: what dialling may raise (ssl.SSLError is an OSError)
DIAL_ERRORS = (OSError, TimeoutError)
#: what the TLS handshake may raise
TLS_ERRORS = (OSError, TimeoutError, ConnectionError)
#: what the client's TLS handshake may raise
CLIENT_TLS_ERRORS = (*TLS_ERRORS, ssl.SSLError)


def dial_failed(exc: OSError | TimeoutError) -> ev.Event:
    if isinstance(exc, OSError) and exc.errno in LOCAL_SHORTAGE:
        return ev.InternalError(f"cannot open a connection to the MX: {exc}")
    if isinstance(exc, TimeoutError):
        return ev.ServerConnectFailed("connect timeout")
    return ev.ServerConnectFailed(str(exc) or type(exc).__name__)


def tls_failed(exc: BaseException) -> ev.TlsFailed:
    return ev.TlsFailed(str(exc) or type(exc).__name__)


def client_tls_failed(exc: BaseException) -> ev.ClientTlsFailed:
    reason = "handshake timeout" if isinstance(exc, TimeoutError) else str(exc)
    return ev.ClientTlsFailed(reason or type(exc).__name__)


def internal_error(exc: Exception) -> ev.InternalError:
    return ev.InternalError(f"{type(exc).__name__}: {exc}")


def close(transport: asyncio.BaseTransport) -> None:
    """Close ``transport``; abort it when TLS refuses a close (the peer ended TLS first:
    "cannot switch state from UNWRAPPED to SHUTDOWN")."""
    try:
        transport.close()
    except RuntimeError:
        transport.abort()  # type: ignore[attr-defined]


def write_timed_out() -> ev.ServerClosed:
    return ev.ServerClosed("write timeout: the MX stopped reading")
