"""A private Postfix instance as the destination MX: STARTTLS, one maildir per recipient.

``PostfixMX`` is a ``PostfixMSA`` (same private layout: its own config, queue, data and log
under a fresh temporary directory, never the system instance) configured as a final
destination: every ``domains`` entry is a virtual mailbox domain, each of ``users`` there
gets its own maildir ``mail/domain/user/`` (other recipients are refused at RCPT), nothing
is ever sent out (bounces are discarded), and smtpd offers STARTTLS with
a trustme certificate. Several smtpd listeners can run with different EHLO keywords, e.g.
one as Postfix ships (PIPELINING, CHUNKING) and one without PIPELINING:

    mx = PostfixMX(
        pki=make_pki("mx.example"),
        domains=["a.example", "b.example"],
        users=["bob", "carol"],
        listeners={"10.0.0.2:25": (), "10.0.0.4:25": ("pipelining",)},  # keywords to hide
        command_prefix=mx_namespace.cmd(),
    )

``stored()`` reads what was delivered: each copy with its recipient, the queue id from the
MX's own ``Received:`` header (the id its ``250 2.0.0 Ok: queued as ...`` reply named), the
Message-ID, whether the client used TLS, and the body (everything after the header
section) as stored. ``connections()`` counts the SMTP connections smtpd accepted.

For the MX-side interop matrix (``tests/system/test_interop_mx.py``) the same MX can run
postscreen(8) in front of its smtpd (``postscreen=True``: ``postscreen_*`` settings in
``settings``; its cache is under the instance's own ``data_directory``), anvil limits or a
policy service (``settings`` as well), and its log is read back: ``peak_connections``
(the most sessions one client, or all, held at once, postscreen's and smtpd's) and
``violations`` (anvil's and postscreen's complaints about one client, by kind).
"""

from __future__ import annotations

import os
import pwd
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from email.parser import BytesHeaderParser
from pathlib import Path

from mailsluice_lab.postfix import PostfixMSA
from tests.support.certs import Pki

#: The delivery account of every mailbox (virtual(8) refuses uids below 100).
MAILBOX_USER = "nobody"

_CLIENT = r"\S*\[(?P<addr>[^\]]+)\]"  # "unknown[10.0.0.1]", "[10.0.0.1]"
_SCREEN = r"/postscreen\[\d+\]: "
#: What anvil(8) and postscreen(8) log against a client, by kind (``violations``); each
#: pattern has the client's address as its group ``addr``.
VIOLATIONS: Mapping[str, str] = {
    "connection count": rf"warning: Connection concurrency limit exceeded: \d+ from {_CLIENT}",
    "connection rate": rf"warning: Connection rate limit exceeded: \d+ from {_CLIENT}",
    "message rate": rf"warning: Message delivery request rate limit exceeded: \d+ from {_CLIENT}",
    "recipient rate": rf"warning: Recipient address rate limit exceeded: \d+ from {_CLIENT}",
    "too many errors": rf"too many errors after \S+ .*from {_CLIENT}",
    "PREGREET": rf"{_SCREEN}PREGREET .* from {_CLIENT}",
    "COMMAND PIPELINING": rf"{_SCREEN}COMMAND PIPELINING from {_CLIENT}",
    "NON-SMTP COMMAND": rf"{_SCREEN}NON-SMTP COMMAND from {_CLIENT}",
    "BARE NEWLINE": rf"{_SCREEN}BARE NEWLINE from {_CLIENT}",
    "COMMAND COUNT LIMIT": rf"{_SCREEN}COMMAND COUNT LIMIT from {_CLIENT}",
    "COMMAND LENGTH LIMIT": rf"{_SCREEN}COMMAND LENGTH LIMIT from {_CLIENT}",
    "COMMAND TIME LIMIT": rf"{_SCREEN}COMMAND TIME LIMIT from {_CLIENT}",
}
_VIOLATIONS = {kind: re.compile(pattern) for kind, pattern in VIOLATIONS.items()}
_SMTPD_CONNECT = re.compile(r"/smtpd\[(?P<pid>\d+)\]: connect from \S*\[(?P<addr>[^\]]+)\]")
_SMTPD_REFUSED = re.compile(r"/smtpd\[(?P<pid>\d+)\]: warning: Connection (concurrency|rate) limit")
_SMTPD_DISCONNECT = re.compile(r"/smtpd\[(?P<pid>\d+)\]: disconnect from ")
_SMTPD_LINE = re.compile(r"/smtpd\[(?P<pid>\d+)\]: ")
_SCREEN_CONNECT = re.compile(r"/postscreen\[\d+\]: CONNECT from \[(?P<addr>[^\]]+)\]:(?P<port>\d+)")
_SCREEN_END = re.compile(
    r"/postscreen\[\d+\]: (?:DISCONNECT|PASS NEW|PASS OLD) \[(?P<addr>[^\]]+)\]:(?P<port>\d+)"
)
#: master.cf for postscreen in front of smtpd (postscreen(8), "Configuring the postscreen
#: service"); tlsproxy is among the common services already
_POSTSCREEN_SERVICES = """\
smtpd     pass  -       -       n       -       -       smtpd
dnsblog   unix  -       -       n       -       0       dnsblog
"""

_RECEIVED_ID = re.compile(r"\bwith (?P<protocol>E?SMTPS?A?) id (?P<queue_id>[0-9A-Za-z]+)")


@dataclass(frozen=True)
class StoredMessage:
    """One copy delivered into one recipient's maildir."""

    recipient: str
    queue_id: str  # from the MX's Received header: the id in its "queued as" reply
    message_id: str  # the Message-ID header, without angle brackets
    protocol: str  # ESMTP, ESMTPS (TLS), ... as the MX's Received header says
    body: bytes  # after the blank line that ends the header section, LF line endings
    path: Path


def split_message(content: bytes) -> tuple[bytes, bytes]:
    """``(header section, body)`` of a message in LF line endings (the body may be empty)."""
    head, sep, body = content.partition(b"\n\n")
    return (head, body) if sep else (head, b"")


class PostfixMX(PostfixMSA):
    """A Postfix MX with STARTTLS and per-recipient maildirs; see the module docstring."""

    def __init__(
        self,
        *,
        pki: Pki,
        domains: Sequence[str],
        users: Sequence[str],
        listeners: Mapping[str, Sequence[str]],
        name: str = "mx",
        command_prefix: Sequence[str] = (),
        settings: Mapping[str, str] | None = None,
        startup_timeout: float = 30.0,
        postscreen: bool = False,
    ) -> None:
        """``users`` at every one of ``domains`` have a mailbox (others are refused at RCPT);
        ``listeners``: ``"HOST:PORT"`` -> EHLO keywords that listener hides (may be empty).
        ``postscreen``: postscreen(8) answers on the listeners and hands the clients that
        pass to smtpd (no keyword can be hidden then).
        """
        if not listeners:
            raise ValueError("an MX needs at least one listener")
        if postscreen and any(listeners.values()):
            raise ValueError("with postscreen, no listener can hide EHLO keywords")
        self.postscreen = postscreen
        first_host, _, first_port = next(iter(listeners)).rpartition(":")
        smtpd_listeners = {
            address: [f"smtpd_discard_ehlo_keywords={','.join(hidden)}"] if hidden else []
            for address, hidden in listeners.items()
        }
        mailbox = pwd.getpwnam(MAILBOX_USER)
        super().__init__(
            relayhost=None,
            name=name,
            host=first_host.strip("[]"),
            port=int(first_port),
            command_prefix=command_prefix,
            smtpd_listeners=smtpd_listeners,
            startup_timeout=startup_timeout,
            settings={},
        )
        files = self.root / "mx"
        self.mail_dir = self.root / "mail"
        files.mkdir(mode=0o755)
        self.mail_dir.mkdir(mode=0o755)
        os.chown(self.mail_dir, mailbox.pw_uid, mailbox.pw_gid)
        key, chain = files / "key.pem", files / "chain.pem"
        pki.leaf.private_key_pem.write_to_path(str(key))
        key.chmod(0o600)
        pki.leaf.cert_chain_pems[0].write_to_path(str(chain))
        for pem in pki.leaf.cert_chain_pems[1:]:
            pem.write_to_path(str(chain), append=True)
        # virtual(8) allows no regexp substitution here: one line per mailbox
        mailboxes = files / "mailboxes"
        mailboxes.write_text(
            "".join(f"{user}@{domain} {domain}/{user}/\n" for domain in domains for user in users)
        )
        self.settings = {
            "myhostname": "mx.example",
            "smtpd_banner": "$myhostname ESMTP",
            "mydestination": "",
            "virtual_mailbox_domains": " ".join(domains),
            "virtual_mailbox_base": str(self.mail_dir),
            "virtual_mailbox_maps": f"texthash:{mailboxes}",
            "virtual_uid_maps": f"static:{mailbox.pw_uid}",
            "virtual_gid_maps": f"static:{mailbox.pw_gid}",
            "virtual_destination_concurrency_limit": "20",
            "smtpd_tls_security_level": "may",
            "smtpd_tls_chain_files": f"{key}, {chain}",
            "smtpd_tls_received_header": "yes",
            "smtpd_tls_loglevel": "1",
            # nothing leaves this MX (a bounce would sit deferred on its queue for ever)
            "default_transport": "discard:this test MX sends nothing out",
            **(settings or {}),
        }

    def listener_lines(self) -> str:
        if not self.postscreen:
            return super().listener_lines()
        screens = "".join(
            f"{address} inet n - n - 1 postscreen\n" for address in self.smtpd_listeners
        )
        return screens + _POSTSCREEN_SERVICES

    def stored(self) -> list[StoredMessage]:
        """Every copy delivered so far (``new/`` and ``cur/`` of every maildir)."""
        found = []
        for path in sorted(self.mail_dir.glob("*/*/new/*")) + sorted(
            self.mail_dir.glob("*/*/cur/*")
        ):
            content = path.read_bytes()
            head, body = split_message(content)
            headers = BytesHeaderParser().parsebytes(head + b"\n\n")
            # The topmost Received header is the MX's own (above it: Return-Path,
            # Delivered-To and X-Original-To, which virtual(8) adds).
            received = headers.get_all("Received") or []
            match = _RECEIVED_ID.search(" ".join(str(received[0]).split())) if received else None
            domain, user = path.parent.parent.parent.name, path.parent.parent.name
            found.append(
                StoredMessage(
                    recipient=f"{user}@{domain}",
                    queue_id=match["queue_id"] if match else "",
                    message_id=str(headers.get("Message-ID", "")).strip().strip("<>"),
                    protocol=match["protocol"] if match else "",
                    body=body,
                    path=path,
                )
            )
        return found

    def connections(self) -> int:
        """SMTP connections smtpd has accepted so far (its ``connect from`` log lines; with
        anvil limits, those it refused at once too: ``served`` leaves them out)."""
        try:
            text = self.maillog.read_text(errors="replace")
        except OSError:
            return 0
        return len(re.findall(r"/smtpd\[\d+\]: connect from ", text))

    def log_lines(self) -> list[str]:
        try:
            return self.maillog.read_text(errors="replace").splitlines()
        except OSError:
            return []

    def violations(self, client: str | None = None) -> Counter[str]:
        """What anvil and postscreen logged against ``client`` (any client: None), by kind
        (``VIOLATIONS``)."""
        found: Counter[str] = Counter()
        for line in self.log_lines():
            for kind, pattern in _VIOLATIONS.items():
                match = pattern.search(line)
                if match is not None and client in (None, match["addr"]):
                    found[kind] += 1
        return found

    def served(self) -> int:
        """SMTP sessions smtpd served: ``connect from`` lines less those anvil refused."""
        lines = self.log_lines()
        connects = sum(1 for line in lines if _SMTPD_CONNECT.search(line))
        return connects - sum(1 for line in lines if _SMTPD_REFUSED.search(line))

    def peak_connections(self, client: str | None = None) -> int:
        """The most connections from ``client`` (every client: None) the MX served at
        once: ``peak_sessions`` of its log."""
        return peak_sessions(self.log_lines(), client)


def peak_sessions(lines: Sequence[str], client: str | None = None) -> int:
    """The most sessions from ``client`` (every client: None) a Postfix MX's log shows it
    serving at once: postscreen's from ``CONNECT`` to its ``DISCONNECT`` or its hand-off
    (``PASS NEW``/``PASS OLD``, after which smtpd logs the same connection), and smtpd's
    from the first line after ``connect from`` to ``disconnect from``, less those anvil
    refused at once (a limit exceeded).

    Why not from ``connect from``: smtpd logs it before asking anvil, and tells anvil of
    the end before it logs ``disconnect from``. A connection anvil let in because an old
    one had just ended can therefore log its ``connect from`` before the old one's
    ``disconnect from``: in log order one more than anvil ever counted. Its next line
    (its TLS, its first transaction) comes after anvil let it in."""
    sessions: dict[str, int] = {}  # smtpd pid -> its current session (a line index)
    refused: set[int] = set()
    for index, line in enumerate(lines):
        if (match := _SMTPD_CONNECT.search(line)) is not None:
            sessions[match["pid"]] = index
        elif (match := _SMTPD_REFUSED.search(line)) and match["pid"] in sessions:
            refused.add(sessions[match["pid"]])
    admitted: set[str] = set()  # smtpd pids whose session's next line will count it
    smtpd: set[str] = set()
    screened: set[str] = set()
    peak = 0
    for index, line in enumerate(lines):
        if (match := _SMTPD_CONNECT.search(line)) is not None:
            if client in (None, match["addr"]) and index not in refused:
                admitted.add(match["pid"])
        elif (match := _SMTPD_DISCONNECT.search(line)) is not None:
            admitted.discard(match["pid"])
            smtpd.discard(match["pid"])
        elif (match := _SMTPD_LINE.search(line)) is not None:
            if match["pid"] in admitted:
                admitted.discard(match["pid"])
                smtpd.add(match["pid"])
        elif (match := _SCREEN_CONNECT.search(line)) is not None:
            if client in (None, match["addr"]):
                screened.add(f"{match['addr']}:{match['port']}")
        elif (match := _SCREEN_END.search(line)) is not None:
            screened.discard(f"{match['addr']}:{match['port']}")
        peak = max(peak, len(smtpd) + len(screened))
    return peak
