"""A private Exim as the destination MX (the MX-side interop matrix, issue 22).

Built on ``EximMSA`` (``tests.support.exim_msa``: Exim unpacked by ``scripts/bootstrap``
into ``.cache/exim``, never installed; our own configuration, spool, log and pid file
under a fresh temporary directory, ``Debian-exim`` known only in a private mount
namespace), but run as a daemon (``-bd``) listening on one address, port 25. It takes
mail for ``users`` at ``domain`` (others are refused at RCPT) and keeps it on its queue
(``queue_only``: nothing is delivered or sent anywhere); what it accepted is read from
its main log (``copies``: each ``<=`` line's Message-ID and recipients). ``limits`` go
into the configuration as they are, e.g.

    with EximMX(address="10.0.0.2", domain="mx.example", users=["bob"],
                limits={"smtp_accept_max_per_connection": "3"},
                command_prefix=ns.cmd()) as mx:
        ...
        mx.copies()            # [(message id, recipient), ...]
        mx.peak_connections()  # the most connections it held (its own count)
        mx.violations("10.0.0.1")  # its refusals of that client, by kind
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from contextlib import suppress

from mailsluice_lab.netns.processes import listening_ports
from tests.support.exim_msa import RUN_AS, EximError, EximMSA

_ARRIVAL = re.compile(r" <= \S+ .*?\bid=(?P<id>\S+).* for (?P<rcpts>.+)$")
_CONNECTION = re.compile(r"SMTP connection from .*\(TCP/IP connection count = (?P<n>\d+)\)")
#: what Exim logs against a client, by kind (each line names the client's address)
VIOLATIONS: Mapping[str, str] = {
    "per connection": r"too many messages in one connection",
    "per host": r"refused: too many connections from that IP address",
    "total": r"refused: too many connections$",
}


class EximMX(EximMSA):
    """An Exim daemon as an MX; see the module docstring."""

    def __init__(
        self,
        *,
        address: str,
        domain: str,
        users: Sequence[str],
        limits: Mapping[str, str] | None = None,
        command_prefix: Sequence[str] = (),
        name: str = "exim-mx",
    ) -> None:
        super().__init__(
            routes={}, interface=address, name=name, command_prefix=command_prefix,
            hostname="exim-mx.example",
        )  # fmt: skip
        self.domain = domain
        self.users = tuple(users)
        self.limits = dict(limits or {})

    def configuration(self) -> str:
        user, group = RUN_AS
        limits = "".join(f"{key} = {value}\n" for key, value in self.limits.items())
        return f"""\
# mailsluice test MX: everything under {self.root}; mail is kept on the queue
primary_hostname = {self.hostname}
exim_path = {self.binary}
exim_user = {user}
exim_group = {group}
never_users =
spool_directory = {self.spool}
log_file_path = {self.log_dir}/%slog
pid_file_path = {self.root}/exim.pid
keep_environment = LD_LIBRARY_PATH
local_interfaces = <; {self.interface}.25
daemon_smtp_ports = 25
disable_ipv6 = true
host_lookup =
rfc1413_hosts =
tls_advertise_hosts =
queue_only = true
smtp_accept_queue_per_connection = 0
log_selector = +smtp_connection +received_recipients +smtp_confirmation
acl_smtp_rcpt = check_rcpt
{limits}
begin acl

check_rcpt:
  accept domains = {self.domain}
         local_parts = {" : ".join(self.users)}
  deny   message = unknown user

begin routers

begin transports

begin retry

begin rewrite

begin authenticators
"""

    def start(self) -> None:
        """Set up (``EximMSA.start``), start the daemon, wait until port 25 listens."""
        super().start()
        done = self.exim("-bd", timeout=30)
        if done.returncode != 0:
            raise EximError(f"exim -bd failed ({done.returncode}): {done.stderr.strip()}")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            pid = 0
            with suppress(OSError, ValueError, IndexError):  # not written yet
                pid = int((self.root / "exim.pid").read_text().split()[0])
            if pid and 25 in listening_ports(pid):
                return
            time.sleep(0.05)
        raise EximError(f"the Exim MX did not listen on port 25: {self.log_text()[-1500:]}")

    def copies(self) -> list[tuple[str, str]]:
        """(Message-ID, recipient) for each recipient of each message it accepted."""
        found = []
        for line in self.log_text().splitlines():
            match = _ARRIVAL.search(line)
            if match is not None:
                message_id = match["id"].strip("<>")
                found += [(message_id, rcpt) for rcpt in match["rcpts"].split()]
        return found

    def peak_connections(self) -> int:
        """The most connections it held at once (its own count, logged at each one)."""
        counts = [int(m["n"]) for m in _CONNECTION.finditer(self.log_text())]
        return max(counts, default=0)

    def connections(self) -> int:
        return len(_CONNECTION.findall(self.log_text()))

    def violations(self, client: str | None = None) -> Counter[str]:
        found: Counter[str] = Counter()
        for line in self.log_text().splitlines():
            if client is not None and f"[{client}]" not in line:
                continue
            for kind, pattern in VIOLATIONS.items():
                if re.search(pattern, line):
                    found[kind] += 1
        return found
