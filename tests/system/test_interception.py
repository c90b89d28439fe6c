"""Real interception: iptables REDIRECT in network namespaces, the real ``mailsluice serve``.

Gateway topology: the client in ``msa`` dials the MX's address on port 25; ``gw``
REDIRECTs it to mailsluice, which reads SO_ORIGINAL_DST and relays to the MX in
``mx``. Because ``gw`` also forwards packets, an MX that sees the *gateway's* address
as its peer proves the proxy carried the session (plain routing would show the
client's address). Same-host topology: MSA and proxy share a namespace, and the
proxy's own outbound connections are exempt from the REDIRECT by owner uid.
"""

from __future__ import annotations

import pytest
from tests.system.netns import (
    MAIL_FROM,
    MESSAGE,
    PROXY_PORT,
    RCPT,
    REJECTED,
    Lab,
    gateway_lab,
    hostport,
    process_uid,
    same_host_lab,
    unprivileged_user,
)

from mailsluice_lab.netns.plumbing import NetnsError

pytestmark = [pytest.mark.system, pytest.mark.timeout(180)]


def peer_host(connection: str) -> str:
    return hostport(connection)[0]


def only_session(lab: Lab) -> dict[str, object]:
    sessions = lab.sessions()
    assert len(sessions) == 1, sessions
    return sessions[0]


def test_a_message_is_intercepted_and_relayed_byte_exact() -> None:
    with gateway_lab(ipv6=False) as (topo, lab):
        proxy = lab.serve(topo.gw)
        result = lab.send(f"{topo.mx_ip}:25")
        assert result.accepted, result
        assert result.refused == {}
        [message] = lab.received()
        assert message.content == MESSAGE
        assert message.mail_from == MAIL_FROM
        assert message.rcpt_tos == (RCPT,)
        # the MX's peer is the gateway: the proxy carried the session, routing did not
        assert [peer_host(c) for c in lab.mx_connections()] == [topo.gw_mx_side_ip]
        assert proxy.stop() == 0, proxy.output()

        session = only_session(lab)
        assert hostport(str(session["destination"])) == (topo.mx_ip, 25)
        assert hostport(str(session["client"]))[0] == topo.client_ip
        assert session["mail_from"] == MAIL_FROM
        assert session["rcpt_to"] == [RCPT]
        assert session["messages"] == 1
        assert session["final_code"] == 221
        transcript = lab.transcript(str(session["id"]))
        lines = transcript.splitlines()
        assert any("C -> S" in line and f"FROM:<{MAIL_FROM}>" in line for line in lines)
        assert any("C <- S" in line and "250 2.0.0 Ok: queued as 0001" in line for line in lines)


def test_mx_refusal_reaches_the_client_unchanged() -> None:
    with gateway_lab(ipv6=False) as (topo, lab):
        lab.serve(topo.gw)
        result = lab.send(f"{topo.mx_ip}:25", rcpt_to=[REJECTED])
        assert not result.accepted
        code, text = result.refused[REJECTED]
        assert code == 550
        assert text == f"5.1.1 <{REJECTED}>: Recipient address rejected"
        assert lab.received() == []


def test_swaks_message_is_relayed_byte_exact() -> None:
    body = MESSAGE.removesuffix(b"\r\n")  # swaks appends the final CRLF itself
    with gateway_lab(ipv6=False) as (topo, lab):
        lab.serve(topo.gw)
        done = lab.swaks(f"{topo.mx_ip}:25", body)
        assert done.returncode == 0, done.stdout + done.stderr
        [message] = lab.received()
        assert message.content == MESSAGE


def test_direct_connection_to_the_proxy_is_refused_as_a_loop() -> None:
    with gateway_lab(ipv6=False) as (topo, lab):
        proxy = lab.serve(topo.gw)
        result = lab.send(f"{topo.gw_ip}:{PROXY_PORT}")
        assert result.code == 421, result
        assert (result.text or "").startswith("4.4.6"), result
        assert lab.mx_connections() == []
        assert proxy.popen.poll() is None, "the proxy must survive a loop attempt"


def test_client_outside_the_allowed_networks_gets_421() -> None:
    with gateway_lab(ipv6=False) as (topo, lab):
        lab.serve(topo.gw, "--allow", "10.251.1.0/25")
        refused = lab.send(f"{topo.mx_ip}:25", source=topo.stranger_ip)
        assert refused.code == 421, refused
        assert (refused.text or "").startswith("4.7.1"), refused
        assert lab.mx_connections() == []
        # the same proxy still relays for the allowed address
        allowed = lab.send(f"{topo.mx_ip}:25", source=topo.client_ip)
        assert allowed.accepted, allowed
        assert len(lab.received()) == 1


def test_outbound_ip_is_the_source_the_mx_sees() -> None:
    with gateway_lab(ipv6=False) as (topo, lab):
        lab.serve(topo.gw, "--outbound-ip", topo.gw_alt_ip)
        result = lab.send(f"{topo.mx_ip}:25")
        assert result.accepted, result
        assert [peer_host(c) for c in lab.mx_connections()] == [topo.gw_alt_ip]


def test_ipv6_interception() -> None:
    with gateway_lab(ipv6=True) as (topo, lab):
        proxy = lab.serve(topo.gw, listen=f"[::]:{PROXY_PORT}")
        result = lab.send(f"[{topo.mx_ip6}]:25")
        assert result.accepted, result
        [message] = lab.received()
        assert message.content == MESSAGE
        assert [peer_host(c) for c in lab.mx_connections()] == [topo.gw_mx_side_ip6]
        assert proxy.stop() == 0, proxy.output()
        session = only_session(lab)
        assert hostport(str(session["destination"])) == (topo.mx_ip6, 25)
        assert hostport(str(session["client"]))[0] == topo.client_ip6


def test_same_host_owner_exclusion() -> None:
    user = unprivileged_user()
    with same_host_lab(user) as (topo, lab):
        proxy = lab.serve(topo.host, listen=f"127.0.0.1:{PROXY_PORT}", user=user)
        assert process_uid(proxy) == user[0]
        result = lab.send(f"{topo.mx_ip}:25")
        assert result.accepted, result
        [message] = lab.received()
        assert message.content == MESSAGE
        # one connection at the MX: the proxy's own dial was not REDIRECTed back to it
        assert len(lab.mx_connections()) == 1
        assert proxy.stop() == 0, proxy.output()
        session = only_session(lab)
        assert hostport(str(session["destination"])) == (topo.mx_ip, 25)
        # OUTPUT REDIRECT rewrites the destination only: the client keeps its source address
        assert hostport(str(session["client"]))[0] == topo.host_ip


def test_proxy_that_cannot_start_is_reported() -> None:
    with gateway_lab(ipv6=False) as (topo, lab), pytest.raises(NetnsError, match="exited"):
        lab.serve(topo.gw, "--allow", "not-a-network")


def test_same_host_without_owner_exclusion_is_refused_as_a_loop() -> None:
    user = unprivileged_user()
    with same_host_lab(user) as (topo, lab):
        # run as root, which the rule does not exempt: the proxy's dial to the MX comes back
        lab.serve(topo.host, listen=f"127.0.0.1:{PROXY_PORT}")
        result = lab.send(f"{topo.mx_ip}:25")
        assert lab.mx_connections() == []
        assert result.code == 421, result
        assert (result.text or "").startswith("4.4.6"), result
