"""What went wrong with a message, in the words of the report: a reply code or an error class.

A refusal by the server is its reply code and the phase it answered (``RCPT 451``); a
connection problem is a class: ``refused``, ``reset``, ``timeout``, ``tls``, ``closed`` (the
server closed the connection), ``protocol`` (a reply that is not SMTP, or too long),
``os-error``; ``generator-backlog`` is an arrival the generator dropped because every client
was busy and the backlog was full (a generator limit, counted as an error all the same).
"""

from __future__ import annotations

import errno
import ssl

BACKLOG = "generator-backlog"


class ProtocolError(Exception):
    """The server sent something that is not an SMTP reply (or one over the size cap)."""


class ServerClosed(ConnectionError):
    """The server closed the connection while a reply was awaited."""


class Failure(Exception):
    """A message failed in ``phase``: ``code`` is the reply code or the error class."""

    def __init__(self, phase: str, code: str, message: str) -> None:
        super().__init__(f"{phase} {code}: {message}")
        self.phase = phase
        self.code = code
        self.message = message

    @property
    def key(self) -> str:
        """How the report counts it: ``"RCPT 451"``, ``"connect refused"``."""
        return f"{self.phase} {self.code}"


def classify(exc: BaseException) -> str:
    """The error class of an exception raised by a connection (see the module docstring)."""
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, ssl.SSLError | ssl.CertificateError):
        return "tls"
    if isinstance(exc, ConnectionResetError | BrokenPipeError | ConnectionAbortedError):
        return "reset"
    if isinstance(exc, ServerClosed):
        return "closed"
    if isinstance(exc, ProtocolError):
        return "protocol"
    if isinstance(exc, OSError):
        if exc.errno == errno.ECONNREFUSED:
            return "refused"
        if exc.errno in (errno.ECONNRESET, errno.EPIPE):
            return "reset"
        if exc.errno == errno.ETIMEDOUT:
            return "timeout"
        return "os-error"
    return "other"


def failure_from(exc: BaseException, phase: str) -> Failure:
    """A ``Failure`` for an exception raised during ``phase``."""
    if isinstance(exc, Failure):
        return exc
    text = str(exc) or type(exc).__name__
    return Failure(phase=phase, code=classify(exc), message=text[:200])


def code_of(key: str) -> str:
    """The code part of a report key: ``"RCPT 451"`` -> ``"451"``."""
    return key.rsplit(" ", 1)[-1]
