"""Late binding: the session borrows an MX connection per transaction (fair sharing).

Playbooks: the greeting and EHLO from what the destination said before; MAIL waits for
a slot (``AcquireServer``); an idle connection of the tenant, or a new one set up by the
proxy itself (greeting, EHLO with the client's name, STARTTLS, EHLO again); the held
commands then go out in order; the connection goes back after the transaction. A
capacity refusal puts the transaction back in line, unseen by the tenant; a wait that
runs out is 451 4.4.5. The client's 2xx to end-of-data is still only the MX's.
"""

from __future__ import annotations

import re

import pytest
from tests.unit.playbook import START, Playbook, c, s, to_c, to_s
from tests.unit.relay_wire import (
    BODY,
    BYE,
    CLIENT,
    CONNECTED,
    DATA,
    DESTINATION,
    EHLO,
    EHLO_AFTER_TLS,
    EHLO_AFTER_TLS_SHOWN,
    EHLO_REPLY,
    EHLO_SHOWN,
    EHLO_TLS,
    GREETING,
    MAIL,
    QUIT,
    RCPT,
    SESSION,
    SOURCE_IP,
    reply,
)

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.config import RelayConfig
from mailsluice.relay.machine import Relay

pytestmark = pytest.mark.unit

CAPACITY = re.compile(r"too many connections", re.IGNORECASE)
MEMO = act.UpstreamState(
    greeting=reply(GREETING),
    hello="EHLO client.example",
    hello_reply=reply(EHLO_SHOWN),
    tls=None,
)
REUSED = act.ReusedUpstream(MEMO, "203.0.113.5:50001", 3)
WAIT_RAN_OUT = b"451 4.4.5 Error: every connection this MX allows us is in use, try again later\r\n"


def borrowed(cached: act.UpstreamState | None = MEMO, **config: object) -> Relay:
    return Relay(
        config=RelayConfig(capacity_refusal=CAPACITY, **config),  # type: ignore[arg-type]
        session_id=SESSION,
        client=CLIENT,
        destination=DESTINATION,
        source_ip=SOURCE_IP,
        borrowed=True,
        cached=cached,
        now=1_000.0,
    )


def greeted_from_memory(**config: object) -> Playbook:
    """Greeted and EHLO answered from what the destination said before: no connection."""
    return Playbook(borrowed(**config)) >> START << to_c(GREETING) >> c(EHLO) << to_c(EHLO_SHOWN)


def waiting() -> Playbook:
    """MAIL, RCPT and DATA pipelined, waiting for a connection."""
    return greeted_from_memory() >> c(MAIL + RCPT + DATA) << act.AcquireServer()


def a_transaction(book: Playbook) -> Playbook:
    """The held commands go out; the MX accepts; the message; its 250."""
    return (
        book
        << to_s(MAIL)
        << to_s(RCPT)
        << to_s(DATA)
        >> s(b"250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n354 go ahead\r\n")
        << to_c(b"250 2.1.0 Ok\r\n")
        << to_c(b"250 2.1.5 Ok\r\n")
        << to_c(b"354 go ahead\r\n")
        >> c(BODY + b".\r\n")
        << to_s(BODY + b".\r\n")
        >> s(b"250 2.0.0 Ok: queued as 1\r\n")
        << to_c(b"250 2.0.0 Ok: queued as 1\r\n")
    )


def test_no_connection_until_a_transaction_needs_one_and_it_goes_back_after() -> None:
    book = (
        a_transaction(waiting() >> ev.ServerReused(REUSED))
        << act.ReleaseServer(MEMO)  # handed back at once: idle, nothing owed
        >> c(QUIT)
        << to_c(BYE)
        << act.CloseClient(linger=False)
    )
    assert book


def test_a_new_connection_is_set_up_by_the_proxy_with_the_clients_name_and_tls() -> None:
    after_tls = act.UpstreamState(
        reply(GREETING), "EHLO client.example", reply(EHLO_AFTER_TLS_SHOWN), ("TLSv1.3", "X", True)
    )
    book = a_transaction(
        waiting()
        >> ev.ServerGranted()
        >> CONNECTED
        >> s(GREETING)
        << to_s(EHLO)  # the client's name, from the proxy
        >> s(EHLO_TLS)
        << to_s(b"STARTTLS\r\n")
        >> s(b"220 2.0.0 Ready\r\n")
        << act.StartServerTls()
        >> ev.TlsStarted("TLSv1.3", "X", True)
        << to_s(EHLO)
        >> s(EHLO_AFTER_TLS)
    ) << act.ReleaseServer(after_tls)
    assert book


def test_the_clients_other_name_is_said_to_a_reused_connection_first() -> None:
    other = b"EHLO other.example\r\n"
    book = (
        Playbook(borrowed())
        >> START
        << to_c(GREETING)
        >> c(other)
        << to_c(EHLO_SHOWN)
        >> c(MAIL)
        << act.AcquireServer()
        >> ev.ServerReused(REUSED)
        << to_s(other)
        >> s(EHLO_REPLY)
        << to_s(MAIL)
        >> s(b"250 2.1.0 Ok\r\n")
        << to_c(b"250 2.1.0 Ok\r\n")
    )
    assert book


def test_a_capacity_refusal_is_the_proxys_business_the_transaction_waits_again() -> None:
    book = (
        waiting()
        >> ev.ServerGranted()
        >> CONNECTED
        >> s(b"421 4.7.0 mx.example Error: too many connections from 203.0.113.5\r\n")
        << act.Requeue(
            "the MX has too many of our connections: "
            "421 4.7.0 mx.example Error: too many connections from 203.0.113.5",
            capacity=True,
        )
        >> ev.ServerReused(REUSED)  # later: a slot, an idle connection
        << to_s(MAIL)
        << to_s(RCPT)
        << to_s(DATA)
    )
    assert book
    assert not [a for a in book.seen if isinstance(a, act.SendToClient) and b"421" in a.data]
    deferred = [a for a in book.seen if isinstance(a, act.MxDeferred)]
    assert deferred == [act.MxDeferred(421, "4.7.0 mx.example Error: too many connections from "
                                            "203.0.113.5")]  # fmt: skip


def test_a_connection_lost_during_its_set_up_is_requeued_too() -> None:
    book = (
        waiting()
        >> ev.ServerGranted()
        >> CONNECTED
        >> ev.ServerClosed("reset by peer")
        << act.Requeue("connection lost during its set-up: reset by peer", capacity=False)
    )
    assert book


def test_another_refusal_of_the_mx_reaches_the_client_as_it_is() -> None:
    refusal = b"554 5.7.1 mx.example no service for you\r\n"
    book = (
        waiting()
        >> ev.ServerGranted()
        >> CONNECTED
        >> s(refusal)
        << to_c(refusal)
        << act.CloseServer()
        << act.CloseClient()
    )
    assert book


def test_a_wait_that_runs_out_is_451_and_the_session_goes_on() -> None:
    book = (
        waiting()
        >> ev.TimerExpired()
        << act.CancelAcquire()
        << to_c(WAIT_RAN_OUT)
        << to_c(WAIT_RAN_OUT)
        << to_c(WAIT_RAN_OUT)
        >> c(QUIT)
        << to_c(BYE)
        << act.CloseClient(linger=False)
    )
    assert book


def test_a_declined_wait_is_451_at_once_with_the_schedulers_reason() -> None:
    """The destination is suspended: the scheduler declines, and what waits gets 451
    4.4.5 with its text now (not at ``hold_max``); the session goes on, and a slot that
    would come late changes nothing."""
    paused = "Error: 192.0.2.1 is paused for 60 s after its rate deferral, try again later"
    told = f"451 4.4.5 {paused}\r\n".encode()
    book = (
        waiting()
        >> ev.ServerDeclined(paused)
        << act.CancelAcquire()
        << to_c(told)
        << to_c(told)
        << to_c(told)
        >> ev.ServerDeclined(paused)
        >> c(QUIT)
        << to_c(BYE)
        << act.CloseClient(linger=False)
    )
    assert book


def test_the_wait_is_hold_max() -> None:
    book = (
        Playbook(borrowed(), ignore=(act.Log,))
        >> START
        << to_c(GREETING)
        << act.SetTimer(RelayConfig().timeouts.client_idle, on_server=False)
        >> c(MAIL)
        << act.AcquireServer()
        << act.SetTimer(RelayConfig().timeouts.hold_max, on_server=True)
    )
    assert book


def test_the_client_leaving_while_it_waits_gives_up_its_place() -> None:
    book = waiting() >> ev.ClientClosed() << act.CancelAcquire() << act.CloseClient()
    assert book


def test_commands_that_need_no_connection_are_answered_without_one() -> None:
    book = (
        greeted_from_memory()
        >> c(b"NOOP\r\nRSET\r\nVRFY postmaster\r\n")
        << to_c(b"250 2.0.0 Ok\r\n")
        << to_c(b"250 2.0.0 Ok\r\n")
        << to_c(b"252 2.0.0 Cannot VRFY user; try RCPT to attempt delivery\r\n")
    )
    assert book


def test_first_contact_asks_at_once_and_the_client_drives_the_set_up() -> None:
    book = (
        Playbook(borrowed(cached=None))
        >> START
        << act.AcquireServer()
        >> ev.ServerGranted()
        >> CONNECTED
        >> s(GREETING)
        << to_c(GREETING)
        >> c(EHLO)
        << to_s(EHLO)
        >> s(EHLO_REPLY)
        << to_c(EHLO_SHOWN)
        << act.ReleaseServer(MEMO)  # idle after EHLO: back to the tenant's pool
        >> c(MAIL)
        << act.AcquireServer()
    )
    assert book


def test_only_the_mxs_2xx_to_the_dot_reaches_the_client_through_a_late_link() -> None:
    book = (
        waiting()
        >> ev.ServerReused(REUSED)
        << to_s(MAIL)
        << to_s(RCPT)
        << to_s(DATA)
        >> s(b"250 Ok\r\n250 Ok\r\n354 go\r\n")
        << to_c(b"250 Ok\r\n")
        << to_c(b"250 Ok\r\n")
        << to_c(b"354 go\r\n")
        >> c(BODY + b".\r\n")
        << to_s(BODY + b".\r\n")
        >> ev.ServerClosed("reset")
        << to_c(b"421 4.4.2 mailsluice Error: connection to destination lost\r\n")
        << act.CloseClient()
    )
    assert book


def test_first_contact_granted_a_connection_already_greeted_gets_its_greeting() -> None:
    """Sessions that came first together wait at the greeting; one of them may be given
    a connection another set up: the client gets that connection's greeting."""
    book = (
        Playbook(borrowed(cached=None))
        >> START
        << act.AcquireServer()
        >> ev.ServerReused(REUSED)
        << to_c(GREETING)
        << act.ReleaseServer(MEMO)  # idle: back at once; the EHLO from what it told
        >> c(EHLO)
        << to_c(EHLO_SHOWN)
    )
    assert book


FULL = b"421 4.7.0 mx.example Error: too many connections from 203.0.113.5\r\n"


def test_a_capacity_refusal_at_a_first_contact_is_unseen_the_client_still_waits() -> None:
    """Sessions that come first together each dial for their greeting; the MX's 421 for
    too many connections to one of them is ours too: back in line, and the greeting the
    client gets is the next connection's."""
    book = (
        Playbook(borrowed(cached=None))
        >> START
        << act.AcquireServer()
        >> ev.ServerGranted()
        >> CONNECTED
        >> s(FULL)
        << act.Requeue(
            "the MX has too many of our connections: " + FULL.decode().rstrip("\r\n"),
            capacity=True,
        )
        >> ev.ServerGranted()
        >> CONNECTED
        >> s(GREETING)
        << to_c(GREETING)
        >> c(EHLO)
        << to_s(EHLO)
    )
    assert book
    assert not [a for a in book.seen if isinstance(a, act.SendToClient) and b"421" in a.data]


def test_a_first_contact_lost_before_its_greeting_waits_again() -> None:
    book = (
        Playbook(borrowed(cached=None))
        >> START
        << act.AcquireServer()
        >> ev.ServerGranted()
        >> CONNECTED
        >> ev.ServerClosed("reset by peer")
        << act.Requeue("connection lost before its greeting: reset by peer", capacity=False)
        >> ev.ServerReused(REUSED)  # another's connection, idle now: its greeting
        << to_c(GREETING)
        << act.ReleaseServer(MEMO)
    )
    assert book


def test_a_failed_dial_waits_again_and_a_reused_connection_then_carries_the_mail() -> None:
    """The shell judges a failed dial (others of ours up: capacity, the transaction
    waits again); what comes next may be an idle connection: the held commands go out
    on it, and the MX's reply to MAIL is MAIL's (no set-up greeting is awaited)."""
    book = (
        waiting()
        >> ev.ServerGranted()
        >> ev.ServerConnectFailed("connection refused")
        << act.Requeue("the connect failed: connection refused", capacity=False)
        >> ev.ServerReused(REUSED)
        << to_s(MAIL)
        << to_s(RCPT)
        << to_s(DATA)
        >> s(b"250 2.1.0 Ok\r\n")
        << to_c(b"250 2.1.0 Ok\r\n")
    )
    assert book


def test_a_failed_dial_the_shell_will_not_retry_is_421_4_4_1() -> None:
    unreachable = b"421 4.4.1 mailsluice Error: destination not reachable, try again later\r\n"
    book = (
        waiting()
        >> ev.ServerGranted()
        >> ev.ServerConnectFailed("connection refused")
        << act.Requeue("the connect failed: connection refused", capacity=False)
        >> ev.ServerConnectFailed("connection refused")  # nothing of ours up: no capacity
        << to_c(unreachable)
        << act.CloseClient()
    )
    assert book


SHUTTING_DOWN = b"421 4.3.2 mailsluice Service shutting down, try again later\r\n"


def test_shutdown_ends_a_session_that_waits_for_a_slot_at_once() -> None:
    """Nothing of its transaction reached the MX: it is not kept through the grace, nor
    started on a connection the destination would open while the proxy drains."""
    book = (
        waiting()
        >> ev.ShutdownRequested()
        << to_c(SHUTTING_DOWN)
        << act.CancelAcquire()
        << act.CloseClient()
    )
    assert book


def test_shutdown_ends_a_first_contact_waiting_for_its_greeting() -> None:
    book = (
        Playbook(borrowed(cached=None))
        >> START
        << act.AcquireServer()
        >> ev.ShutdownRequested()
        << to_c(SHUTTING_DOWN)
        << act.CancelAcquire()
        << act.CloseClient()
    )
    assert book


def test_every_new_connection_is_upgraded_to_tls_not_only_the_first() -> None:
    """A session's second connection (the first went back after its transaction) is a new
    TCP connection: the proxy says STARTTLS on it too, whatever the first one had."""
    after_tls = act.UpstreamState(
        reply(GREETING), "EHLO client.example", reply(EHLO_AFTER_TLS_SHOWN), ("TLSv1.3", "X", True)
    )
    refused = b"550 5.7.1 not this one\r\n"

    def new_connection(book: Playbook) -> Playbook:
        return (
            book
            << act.AcquireServer()
            >> ev.ServerGranted()
            >> CONNECTED
            >> s(GREETING)
            << to_s(EHLO)
            >> s(EHLO_TLS)
            << to_s(b"STARTTLS\r\n")
            >> s(b"220 2.0.0 Ready\r\n")
            << act.StartServerTls()
            >> ev.TlsStarted("TLSv1.3", "X", True)
            << to_s(EHLO)
            >> s(EHLO_AFTER_TLS)
            << to_s(MAIL)
        )

    book = new_connection(greeted_from_memory() >> c(MAIL))
    book >> s(refused) << to_c(refused) << act.ReleaseServer(after_tls)
    assert new_connection(book >> c(MAIL))
