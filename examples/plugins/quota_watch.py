"""A worked example of a mailsluice plugin: watch every session, and filter messages.

Load it from the configuration (this directory must be on the Python path, or the
module packaged with an entry point in the ``mailsluice.plugins`` group)::

    [[plugins]]                      # the watching hooks: a report per destination
    use = "quota_watch:Watcher"
    report_every = 100               # log a summary every N transactions

    [[filters]]                      # the filter: refuse messages with a banned subject
    type = "plugin"
    use = "quota_watch:SubjectFilter"
    banned = ["lottery", "wire transfer"]

Hooks may be plain methods or coroutines. Watching hooks run off the mail path (a slow
one only delays its own queue); ``filter`` runs on it, within ``[filtering] timeout``.
A filter never says "accepted" to the client: it returns ``Accept`` (relay), a 4xx/5xx
``Reject``, ``EditHeaders`` or ``Replace``, and the MX's reply decides the rest.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

from mailsluice.filtering.api import (
    Accept,
    AddHeader,
    EditHeaders,
    FilterMessage,
    Reject,
    Verdict,
)
from mailsluice.plugins.api import Plugin
from mailsluice.relay.records import SessionClosed, SessionOpened, TransactionEnded

log = logging.getLogger("quota_watch")


class Watcher(Plugin):
    """Counts transactions per destination and outcome; logs a summary now and then."""

    name = "quota-watch"

    def __init__(self, options: dict[str, Any]) -> None:
        self.report_every = int(options.get("report_every", 100))
        self.destination_of: dict[str, str] = {}  # session id -> original destination
        self.outcomes: collections.Counter[tuple[str, str]] = collections.Counter()
        self.sessions_ended = 0
        self._seen = 0

    def session_started(self, record: SessionOpened) -> None:
        self.destination_of[record.session_id] = record.destination

    async def transaction_ended(self, record: TransactionEnded) -> None:
        destination = self.destination_of.get(record.session_id, "?")
        self.outcomes[(destination, record.outcome)] += 1
        self._seen += 1
        if self._seen % self.report_every == 0:
            log.info("transactions by destination and outcome: %s", dict(self.outcomes))

    def session_ended(self, record: SessionClosed) -> None:
        self.destination_of.pop(record.session_id, None)
        self.sessions_ended += 1


class SubjectFilter:
    """Refuses messages whose Subject contains a banned phrase; tags the others."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.name = str(options.get("name", "subject-filter"))
        self.banned = tuple(str(p).lower() for p in options.get("banned", ()))

    async def filter(self, message: FilterMessage) -> Verdict:
        subject = str(message.email().get("Subject", "")).lower()
        for phrase in self.banned:
            if phrase in subject:
                return Reject(554, f"5.7.1 Message refused: subject contains {phrase!r}")
        if not self.banned:
            return Accept()
        return EditHeaders(add=(AddHeader("X-Subject-Checked", "yes"),))
