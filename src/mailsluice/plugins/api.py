"""The plugin API: objects that watch sessions and may filter messages.

A plugin is any object with a ``name`` and some of these methods (each may be a plain
function or a coroutine function):

- ``session_started(record: SessionOpened)``: a client connected (client, original
  destination, chosen source IP);
- ``line(record: TranscriptLine)``: each command and reply, in order, with direction
  and time;
- ``transaction_ended(record: TransactionEnded)``: envelope, size, final reply, timings;
- ``session_ended(record: SessionClosed)``: the session is over;
- ``filter(message: FilterMessage) -> Verdict``: decide about a message before it is
  relayed (see :mod:`mailsluice.filtering.api`);
- ``close()``: called once at shutdown.

The watching hooks run *off* the mail path: they are fed from the session log's
bounded background queue, in order, on a thread of their own, so a slow or failing
plugin never delays mail (records it cannot keep up with are dropped and counted).
``filter`` runs *on* the mail path, with a timeout, and a filter that raises or hangs
gets the failure policy (``451 4.3.0`` by default), never a 2xx.

Plugins are found through the entry-point group ``mailsluice.plugins`` or named as
``module:attribute`` in the configuration (``plugins = ["mypkg.hooks:plugin"]``); the
attribute is either a plugin object or a callable that returns one given the plugin's
option table (a ``dict``).

:class:`Plugin` is a convenient base class with do-nothing hooks; it is not required.
"""

from __future__ import annotations

from collections.abc import Awaitable

from mailsluice.relay.records import SessionClosed, SessionOpened, TransactionEnded, TranscriptLine

__all__ = ["ENTRY_POINT_GROUP", "HOOKS", "Plugin"]

ENTRY_POINT_GROUP = "mailsluice.plugins"

# The watching hooks, in the order a session produces them.
HOOKS = ("session_started", "line", "transaction_ended", "session_ended")


class Plugin:
    """Base class with no-op hooks; override the ones you need (sync or async)."""

    name = "plugin"

    def session_started(self, record: SessionOpened) -> Awaitable[None] | None:
        return None

    def line(self, record: TranscriptLine) -> Awaitable[None] | None:
        return None

    def transaction_ended(self, record: TransactionEnded) -> Awaitable[None] | None:
        return None

    def session_ended(self, record: SessionClosed) -> Awaitable[None] | None:
        return None

    def close(self) -> Awaitable[None] | None:
        return None
