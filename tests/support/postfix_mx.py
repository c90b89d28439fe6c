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
"""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from email.parser import BytesHeaderParser
from pathlib import Path

from tests.support.certs import Pki
from tests.support.postfix_msa import PostfixMSA

#: The delivery account of every mailbox (virtual(8) refuses uids below 100).
MAILBOX_USER = "nobody"

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
    ) -> None:
        """``users`` at every one of ``domains`` have a mailbox (others are refused at RCPT);
        ``listeners``: ``"HOST:PORT"`` -> EHLO keywords that listener hides (may be empty).
        """
        if not listeners:
            raise ValueError("an MX needs at least one listener")
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
        """SMTP connections smtpd has accepted so far (its ``connect from`` log lines)."""
        try:
            text = self.maillog.read_text(errors="replace")
        except OSError:
            return 0
        return len(re.findall(r"/smtpd\[\d+\]: connect from ", text))
