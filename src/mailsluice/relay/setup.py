"""A connection the proxy sets up itself, and what needs no connection (pure).

Both leases sometimes set up an MX connection that the client does not drive: late
binding (``borrowed``) for every connection it dials after a first contact, and a
dedicated session (``lease``) whose connection was closed after a message the proxy
refused itself. The set-up is the same: the MX's greeting, taken by the lease; an EHLO
(the client's last name, or our own), STARTTLS when offered (``upgrade``), the EHLO
again; then the commands that waited in ``held`` go out, in order (``Relay.send_held``: one
at a time when the connection does not offer PIPELINING).

Without a connection, a few commands are answered as the MX would (``IDLE_ANSWERS``).
"""

from __future__ import annotations

from mailsluice.relay import actions as act
from mailsluice.relay.accounting import address_text
from mailsluice.relay.outbox import Outbox
from mailsluice.relay.records import Direction
from mailsluice.relay.state import Await, RelayState, Sent
from mailsluice.smtp import ehlo
from mailsluice.smtp.commands import Command, parse_command
from mailsluice.smtp.replies import Reply

__all__ = ["BYE", "IDLE_ANSWERS", "default_hello", "hello_text", "pipelines", "send_hello"]

BYE = Reply.make(221, "2.0.0", "Bye")
_OK = Reply.make(250, "2.0.0", "Ok")
#: What needs no connection while none is held (the MX would answer so too).
IDLE_ANSWERS = {
    "NOOP": _OK,
    "RSET": _OK,
    "VRFY": Reply.make(252, "2.0.0", "Cannot VRFY user; try RCPT to attempt delivery"),
    "EXPN": Reply.make(502, "5.5.1", "Error: command not implemented"),
    "HELP": Reply.make(214, "2.0.0", "See RFC 5321"),
}


def hello_text(command: Command) -> str:
    """An EHLO/HELO as the memo keeps it: "EHLO name"."""
    return f"{command.verb} {address_text(command.argument)}"


def default_hello(hostname: str) -> Command:
    """The EHLO a set-up sends for a client that sent none (a real MX sees one)."""
    parsed = parse_command(f"EHLO {hostname}".encode())
    assert isinstance(parsed, Command)
    return parsed


def send_hello(state: RelayState, out: Outbox, hello: Command) -> None:
    """Our own EHLO/HELO in a set-up; its reply is the lease's (``remember_hello``)."""
    out.client_line(hello.line, Direction.PROXY_TO_SERVER)
    out.add(act.SendToServer(hello.wire))
    state.awaiting.append(Sent(Await.HELLO, command=hello))


def pipelines(memo: act.UpstreamState) -> bool:
    """Whether a connection kept from before offered PIPELINING (its EHLO reply)."""
    return memo.hello.startswith("EHLO ") and "PIPELINING" in ehlo.keywords(memo.hello_reply)
