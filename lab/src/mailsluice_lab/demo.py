"""``mailsluice demo``: watch mailsluice relay two messages, then read its session log.

Default: everything in this process, on 127.0.0.1 only. The lab's MX (recording into a
maildir, offering STARTTLS) starts on a free port, the proxy starts in front of it with a
fixed upstream, and the lab's sender sends two messages through the proxy: one the MX
accepts, one to a recipient the MX refuses with 550 -- the client sees the MX's own
reply. Then the session list and each transcript are printed from the SQLite log.

``--netns`` (root): the same with real interception. Three throw-away network
namespaces (MSA, gateway, MX; see :mod:`mailsluice_lab.netns`), ``mailsluice serve``
running transparently in the gateway behind an ``iptables REDIRECT`` rule, and the
client dialling the MX's own address on port 25. Everything is removed at the end.

Bounded in time: each step has a deadline, and the demo stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from email.utils import formatdate
from pathlib import Path
from typing import TextIO

from mailsluice.runtime.server import Proxy
from mailsluice.sessionlog.cli_commands import print_sessions, print_transcript
from mailsluice.sessionlog.reader import list_sessions
from mailsluice.settings.config import HostPort, Settings
from mailsluice_lab.netns.plumbing import NetnsError, unavailable_reason
from mailsluice_lab.netns.processes import DEMO_MX_HOSTNAME, send_in, start_mx, start_proxy
from mailsluice_lab.netns.topologies import gateway
from mailsluice_lab.peers.certs import self_signed_context
from mailsluice_lab.peers.mx import ScriptedMX
from mailsluice_lab.peers.recorders import MaildirRecorder, read_maildir
from mailsluice_lab.peers.run_mx import reject_pattern
from mailsluice_lab.peers.sender import SendResult, send_message

MAIL_FROM = "alice@msa.example"
ACCEPTED = "bob@mx.example"
REJECTED = "nobody@mx.example"  # the demo MX refuses this recipient with 550 5.1.1
PROXY_PORT = 10025  # inside the gateway namespace
DEADLINE = 60.0  # seconds for the whole in-process demo


def message(rcpt: str, number: int) -> bytes:
    return (
        f"From: Alice <{MAIL_FROM}>\r\n"
        f"To: <{rcpt}>\r\n"
        f"Subject: mailsluice demo message {number}\r\n"
        f"Date: {formatdate(localtime=False)}\r\n"
        f"Message-ID: <demo-{number}@msa.example>\r\n"
        "\r\n"
        "Relayed end to end by mailsluice: the reply you got is the MX's own.\r\n"
    ).encode()


def _say(out: TextIO, text: str = "") -> None:
    out.write(text + "\n")
    out.flush()


def _report_send(out: TextIO, number: int, rcpt: str, result: SendResult) -> None:
    _say(out, f"  message {number}: {MAIL_FROM} -> {rcpt}: {result.describe()}")


def _report_log(out: TextIO, maildir: Path, log_url: str) -> int:
    received = read_maildir(maildir) if maildir.is_dir() else []
    _say(out, f"\nThe MX stored {len(received)} message(s) in {maildir}.")
    _say(out, f"\n$ mailsluice sessions --log {log_url}")
    status = print_sessions(log_url, as_json=False, limit=10, out=out)
    for session in reversed(list_sessions(log_url, limit=10)):
        _say(out, f"\n$ mailsluice transcript --log {log_url} {session['id']}")
        status = max(status, print_transcript(log_url, str(session["id"]), out))
    return status


def local_mx(maildir: Path) -> ScriptedMX:
    """The demo's MX on a free loopback port, as :func:`start_mx` runs it in a namespace:
    STARTTLS (self-signed), a maildir, queue ids like its files, REJECTED refused."""
    return ScriptedMX(
        host="127.0.0.1", hostname=DEMO_MX_HOSTNAME, reject_rcpt=reject_pattern([REJECTED]),
        tls=self_signed_context(maildir.parent / "mx-tls", DEMO_MX_HOSTNAME),
        qid_format="{:04d}", recorders=[MaildirRecorder(maildir)],
    )  # fmt: skip


async def _relay_locally(maildir: Path, log_url: str, out: TextIO) -> list[SendResult]:
    async with asyncio.timeout(DEADLINE):
        async with local_mx(maildir) as mx:
            mx_port = mx.port
            settings = Settings(
                listen=HostPort("127.0.0.1", 0),
                upstream=HostPort("127.0.0.1", mx_port),
                log=log_url,
                shutdown_grace=5.0,
            )
            async with Proxy(settings) as proxy:
                _say(out, f"MX (the lab's, refuses {REJECTED}) listening on 127.0.0.1:{mx_port}")
                _say(out, f"mailsluice listening on 127.0.0.1:{proxy.port}, relaying to it")
                _say(out, f"session log: {log_url}\n")
                results = []
                for number, rcpt in enumerate((ACCEPTED, REJECTED), start=1):
                    result = await send_message(
                        "127.0.0.1", proxy.port, MAIL_FROM, [rcpt], message(rcpt, number),
                        timeout=20.0,
                    )  # fmt: skip
                    _report_send(out, number, rcpt, result)
                    results.append(result)
    return results


def _relay_in_namespaces(
    workdir: Path, log_url: str, out: TextIO
) -> tuple[list[SendResult], Path] | None:
    reason = unavailable_reason()
    if reason is not None:
        _say(sys.stderr, f"mailsluice demo --netns: {reason}")
        return None
    results: list[SendResult] = []
    with ExitStack() as stack:
        topo = stack.enter_context(gateway(PROXY_PORT, ipv6=False))
        _say(out, "network namespaces (removed at the end):")
        _say(out, f"  MSA      {topo.msa.name}  {topo.client_ip}")
        _say(out, f"  gateway  {topo.gw.name}   {topo.gw_ip} | {topo.gw_mx_side_ip}  (mailsluice)")
        _say(out, f"  MX       {topo.mx.name}   {topo.mx_ip}:25")
        _say(out, f"interception rule in the gateway:\n  {' '.join(topo.rules[0])}")
        _, maildir = start_mx(stack, topo.mx, workdir, reject=[REJECTED])
        serve = ["--listen", f"0.0.0.0:{PROXY_PORT}", "--log", log_url]
        proxy = start_proxy(stack, topo.gw, serve, PROXY_PORT, workdir / "serve.out")
        _say(out, f"$ ip netns exec {topo.gw.name} mailsluice serve {' '.join(serve)}\n")
        _say(out, f"the MSA dials the MX's own address, {topo.mx_ip}:25:")
        for number, rcpt in enumerate((ACCEPTED, REJECTED), start=1):
            file = workdir / f"message-{number}.eml"
            file.write_bytes(message(rcpt, number))
            result = send_in(topo.msa, f"{topo.mx_ip}:25", MAIL_FROM, [rcpt], file)
            _report_send(out, number, rcpt, result)
            results.append(result)
        if proxy.stop() != 0:
            _say(sys.stderr, f"mailsluice serve did not exit cleanly:\n{proxy.output()}")
    return results, maildir


@contextmanager
def _workdir(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep.resolve()
        return
    with tempfile.TemporaryDirectory(prefix="mailsluice-demo-") as tmp:
        yield Path(tmp)


def main(argv: list[str]) -> int:
    """Run the demo; 0 when the MX's accept and its refusal both reached the client."""
    parser = argparse.ArgumentParser(prog="mailsluice demo", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--netns", action="store_true", help="real interception in network namespaces (root)"
    )
    parser.add_argument(
        "--keep", type=Path, metavar="DIR", help="keep the log and the MX's mail in DIR"
    )
    args = parser.parse_args(argv[1:] if argv[:1] == ["--"] else argv)
    out = sys.stdout
    with _workdir(args.keep) as workdir:
        log_url = f"sqlite:{workdir / 'sessions.db'}"
        if args.netns:
            try:
                outcome = _relay_in_namespaces(workdir, log_url, out)
            except NetnsError as exc:
                _say(sys.stderr, f"mailsluice demo --netns: {exc}")
                return 1
            if outcome is None:
                return 2
            results, maildir = outcome
        else:
            maildir = workdir / "maildir"
            results = asyncio.run(_relay_locally(maildir, log_url, out))
        status = _report_log(out, maildir, log_url)
        if args.keep is None:
            _say(out, "\n(the demo's files are removed now; --keep DIR keeps them)")
    ok = (
        len(results) == 2
        and results[0].accepted
        and not results[1].accepted
        and results[1].refused.get(REJECTED, (0, ""))[0] == 550
    )
    return status if ok else 1
