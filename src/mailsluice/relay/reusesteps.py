"""Connection reuse, the relay's side (pure): start on an open MX connection, give it back.

With reuse on, the shell keeps an MX connection that a session leaves cleanly (QUIT
after EHLO, no transaction open, no reply owed) and hands it to the next session from
the same client to the same destination (``runtime.upstreampool``). The MX sees what it
would see from an MSA that caches its connections (as Postfix does): one SMTP session
carrying several transactions, each started by MAIL FROM.

A session on a reused connection:

* gets the MX's own greeting, replayed (no round trip);
* gets its first EHLO (or HELO) answered with the reply the MX gave to the same command
  (for EHLO: the capability list, edited as it was); a different name or verb is sent
  to the MX, which resets its state (RFC 5321 §4.1.4), and its reply is relayed;
* is relayed as usual from MAIL FROM on: the MX's real replies, the same rules. If the
  MX dropped the idle connection meanwhile, the client gets ``421 4.4.2`` and retries.

At QUIT, a session that may release (``may_release``) and whose MX connection is idle
(after a positive EHLO/HELO reply, no transaction, no reply owed)
emits ``ReleaseServer`` instead of relaying QUIT, and answers ``221`` itself. Anything
else (a transaction open, a reply owed, filters running, shutting down) sends QUIT to
the MX as without reuse.
"""

from __future__ import annotations

from mailsluice.relay import actions as act
from mailsluice.relay.accounting import address_text
from mailsluice.relay.pending import Pending, Phase
from mailsluice.relay.records import Direction
from mailsluice.relay.tlssteps import TlsSteps
from mailsluice.smtp.commands import Command
from mailsluice.smtp.replies import Reply


class ReuseSteps(TlsSteps):
    """Starting on a reused MX connection, answering EHLO from it, releasing it."""

    __slots__ = ()

    def _start_reused(self, reused: act.ReusedUpstream) -> None:
        self._server_open = self._connected = True
        self._phase = Phase.COMMANDS
        self._account.tls = reused.state.tls
        self._note(
            f"reusing the connection to {self._client_desc[1]} from {reused.source} "
            f"(client session {reused.sessions + 1} on it)"
        )
        self._send_client(reused.state.greeting, Direction.PROXY_TO_CLIENT)

    def _hello_cached(self, command: Command) -> bool:
        """Answer the first EHLO/HELO of a reused session from the cache when it is the one
        the MX last answered and nothing is open upstream; False: send it to the MX."""
        self._hello_from_cache = False
        cache = self._hello
        if cache is None or cache[0] != _hello_text(command) or self._pending:
            return False
        self._account.helo = address_text(command.argument)
        self._log_client(command.line, Direction.CLIENT_TO_PROXY)
        self._local(cache[1])
        return True

    def _remember_greeting(self, reply: Reply) -> None:
        if self._may_release:
            self._greeting = reply if reply.code == 220 else None

    def _remember_hello(self, entry: Pending, client_reply: Reply) -> None:
        """The reply the client got to EHLO/HELO (after TLS, edited): what a session on
        this connection later gets for the same command."""
        if not self._may_release:  # nothing will be kept: spare the work
            return
        command = entry.command
        if command is None or not client_reply.is_positive:
            self._hello = None
        else:
            self._hello = (_hello_text(command), client_reply)

    def _try_release(self, command: Command) -> bool:
        """QUIT: keep the MX connection for a later session if it is idle and clean."""
        greeting, cache = self._greeting, self._hello
        if (
            not self._may_release
            or not self._server_open
            or greeting is None
            or cache is None
            or self._pending
            or self._account.transaction is not None
            or self._filtering
            or self._shutdown
            or self._phase is not Phase.COMMANDS
        ):
            return False
        self._log_client(command.line, Direction.CLIENT_TO_PROXY)
        self._note("upstream connection kept for reuse")
        self._server_open = False
        state = act.UpstreamState(greeting, cache[0], cache[1], self._account.tls)
        self._out.append(act.ReleaseServer(state))
        self._local(Reply.make(221, "2.0.0", "Bye"), close=True, reason="quit")
        return True


def _hello_text(command: Command) -> str:
    return f"{command.verb} {address_text(command.argument)}"
