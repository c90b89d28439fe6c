"""Filter mode under random interleavings: the client's 2xx to a message is the MX's.

A client pipelines whole transactions (MAIL, RCPT, DATA, a body, the dot); the MX
answers with any code at any time; verdicts, timer expiries and closes arrive in any
order. The client reads its replies in order, as a pipelining MSA does, so each reply
is matched to the command it answers. Invariants:

* a 2xx for end-of-data reaches the client only when the relay sent that message to
  the MX (``SendSpooled``) and the MX's next reply after it was a 2xx;
* the MX never gets a message body from the relay itself (bodies only go through
  ``SendSpooled``, after the MX's 354 to our DATA), and never a 2nd DATA in a row
  before it answered the first;
* the client never gets more replies than it is owed, plus at most one final 4xx.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.config import RelayConfig
from mailsluice.relay.machine import Relay
from mailsluice.smtp.lines import Line, LineFramer
from mailsluice.smtp.replies import Reply, ReplyAssembler

pytestmark = pytest.mark.unit

TRANSACTION = [b"MAIL FROM:<a@b.example>", b"RCPT TO:<c@d.example>", b"DATA"]
BODY = b"Subject: x\r\n\r\nbody\r\n.\r\n"
VERDICTS = [None, (550, "5.7.1 no"), (451, "4.7.1 later")]
DELIVERED = [("txn",), ("mx", 250), ("mx", 250), ("verdict", None), ("mx", 354), ("mx", 250)]

steps = st.lists(
    st.one_of(
        st.just(("txn",)),
        st.tuples(st.just("mx"), st.sampled_from([250, 250, 250, 354, 451, 550, 421, 221])),
        st.tuples(st.just("verdict"), st.sampled_from(VERDICTS)),
        st.just(("timer",)),
        st.just(("mx-closed",)),
        st.just(("client-closed",)),
        st.just(("quit",)),
    ),
    max_size=40,
)  # fmt: skip


class Client:
    """Reads replies in order and matches each to the command it answers."""

    def __init__(self) -> None:
        self.owed: list[str] = ["GREETING"]
        self.framer = LineFramer(4096)
        self.assembler = ReplyAssembler()
        self.extra = 0

    def receive(self, data: bytes) -> list[tuple[str, Reply]]:
        self.framer.feed(data)
        out = []
        while (line := self.framer.next_line()) is not None:
            assert isinstance(line, Line)
            reply = self.assembler.add_line(line.content)
            if reply is None:
                continue
            if self.owed:
                out.append((self.owed.pop(0), reply))
            else:
                self.extra += 1
                assert reply.code // 100 == 4, reply  # only a final 4xx may be unasked for
                assert self.extra <= 1
        return out


@settings(deadline=None)
@given(script=steps)
@example(script=DELIVERED)  # the path that does deliver: it must stay reachable
@example(script=[*DELIVERED, ("txn",), ("mx", 250), ("mx", 250), ("timer",), ("mx", 250),
                 ("verdict", (550, "5.7.1 no")), ("mx", 250), *DELIVERED[:3]])  # fmt: skip
def test_a_2xx_for_a_message_is_always_the_mxs(script: list[tuple[object, ...]]) -> None:
    relay = Relay(
        config=RelayConfig(filtering=True, filter_keepalive=30.0),
        session_id="p",
        client="192.0.2.1:1000",
        destination="198.51.100.1:25",
        now=0.0,
    )
    client = Client()
    sent_spooled = False  # SendSpooled emitted, MX reply to the message not yet seen
    mx_said_2xx_to_message = 0  # how many end-of-data 2xx the MX gave
    client_got_2xx_for_message = 0
    body_due = 0  # 354s the client got for its DATA: it sends a body for each

    def perform(actions: list[act.Action]) -> None:
        nonlocal sent_spooled, client_got_2xx_for_message, body_due
        for action in actions:
            if isinstance(action, act.SendSpooled):
                assert not sent_spooled
                sent_spooled = True
            elif isinstance(action, act.SendToServer):
                assert b"\r\n.\r\n" not in action.data  # no body ever leaves this way
            elif isinstance(action, act.SendToClient):
                for command, reply in client.receive(action.data):
                    if command == "DATA" and reply.code == 354:
                        body_due += 1
                    if command == "EOD" and reply.is_positive:
                        client_got_2xx_for_message += 1
                        assert client_got_2xx_for_message <= mx_said_2xx_to_message

    perform(relay.start())
    perform(relay.handle(ev.ServerConnected("203.0.113.1:4000"), 0.0))
    perform(relay.server_data(b"220 mx ESMTP\r\n", 0.0))
    perform(relay.client_data(b"EHLO c.example\r\n", 0.0))
    client.owed.append("EHLO")
    perform(relay.server_data(b"250 mx\r\n", 0.0))
    now = 0.0
    for step in script:
        now += 1.0
        if relay.closed:
            break
        kind = step[0]
        if kind == "txn":
            client.owed += ["MAIL", "RCPT", "DATA"]
            perform(relay.client_data(b"".join(c + b"\r\n" for c in TRANSACTION), now))
        elif kind == "quit":
            client.owed.append("QUIT")
            perform(relay.client_data(b"QUIT\r\n", now))
        elif kind == "mx":
            code = step[1]
            assert isinstance(code, int)
            if sent_spooled and code != 354:
                sent_spooled = False
                if code // 100 == 2:
                    mx_said_2xx_to_message += 1
            perform(relay.server_data(b"%d reply\r\n" % code, now))
        elif kind == "verdict":
            reject = step[1]
            perform(relay.handle(ev.FilterDecided(reject), now))  # type: ignore[arg-type]
        elif kind == "timer":
            perform(relay.handle(ev.TimerExpired(), now))
        elif kind == "mx-closed":
            sent_spooled = False
            perform(relay.handle(ev.ServerClosed("reset"), now))
        else:
            perform(relay.handle(ev.ClientClosed(), now))
        while body_due and not relay.closed:  # as a real client: the body after the 354
            body_due -= 1
            client.owed.insert(client.owed.index("DATA") + 1 if "DATA" in client.owed else 0,
                               "EOD")  # fmt: skip
            perform(relay.client_data(BODY, now))
    assert client_got_2xx_for_message <= mx_said_2xx_to_message
    if script == DELIVERED:  # the model itself is not vacuous
        assert client_got_2xx_for_message == 1
