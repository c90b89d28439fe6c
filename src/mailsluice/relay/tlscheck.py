"""Per-domain TLS policy checks (pure): a recipient waits until the shell says the
MX connection meets its domain's TLS policy.

The proxy makes its TLS handshake with the MX at EHLO, before any recipient is known;
what a destination requires (an operator's ``[[tls_policies]]`` rule, DANE, MTA-STS) is
known per recipient domain. So the first recipient of each domain in a transaction
waits: its reply is owed as a barrier (nothing more is read from the client, so no
later RCPT or DATA can overtake it) and, once the connection it would go over is open,
``CheckTlsPolicy(domain)`` goes to the shell. The shell resolves the domain's policy,
checks the connection's TLS facts against it and answers ``TlsPolicyChecked``:

* ok: the RCPT goes to the MX as usual; later recipients of the same domain in the
  same transaction go straight through (the connection does not change within it);
* not ok: the RCPT gets the shell's 4xx (``451 4.7.5``): the tenant keeps the message
  and retries; the recipient never reaches the MX, and neither does the message.

Every decision goes into the transcript (``note``). Without policy checks (no rules,
discovery off, ``may``) nothing of this runs.
"""

from __future__ import annotations

from mailsluice.relay import actions as act
from mailsluice.relay.outbox import Conductor, Outbox
from mailsluice.relay.records import Direction
from mailsluice.relay.state import Await, Link, Owed, PolicyCheck, RelayState, Slot
from mailsluice.smtp.commands import Command
from mailsluice.smtp.replies import Reply

__all__ = ["PolicyChecks", "recipient_domain"]


def recipient_domain(address: bytes | None) -> str | None:
    """The domain of a recipient address, lower case; None for ``<>``, ``postmaster``
    or an address literal (``[192.0.2.1]``: no policy domain to speak of)."""
    if not address:
        return None
    _, at, domain = address.rpartition(b"@")
    if not at or not domain or domain.startswith(b"["):
        return None
    return domain.decode("utf-8", "replace").lower().rstrip(".")


class PolicyChecks:
    """Holds recipients for their domain's TLS policy check; see the module docstring."""

    __slots__ = ("_enabled", "_out", "_relay", "_state")

    def __init__(self, state: RelayState, out: Outbox, relay: Conductor, *, enabled: bool) -> None:
        self._state = state
        self._out = out
        self._relay = relay
        self._enabled = enabled

    def new_transaction(self) -> None:
        self._state.policy_passed.clear()

    def rcpt(self, command: Command) -> bool:
        """True when this RCPT waits for its domain's check (its reply is owed)."""
        state = self._state
        if not self._enabled:
            return False
        domain = recipient_domain(command.address)
        if domain is None or domain in state.policy_passed:
            return False
        slot = Slot(Owed.RCPT, barrier=True, command=command)
        state.owed.append(slot)
        state.policy_check = PolicyCheck(slot, domain)
        self.ask()
        return True

    def ask(self) -> None:
        """Send the waiting check once the connection it is about is open."""
        state = self._state
        pending = state.policy_check
        if pending is None or pending.asked:
            return
        if state.link is Link.OPEN and not state.held:
            pending.asked = True
            self._out.add(act.CheckTlsPolicy(pending.domain))

    def checked(self, domain: str, ok: bool, reply: Reply | None, note: str) -> None:
        state = self._state
        pending = state.policy_check
        if pending is None or not pending.asked or pending.domain != domain:
            return  # not ours to answer (a shell bug): the recipient keeps waiting
        state.policy_check = None
        self._out.note(f"TLS policy {note}")
        slot = pending.slot
        command = slot.command
        assert command is not None
        if ok:
            state.policy_passed.add(domain)
            slot.barrier = False
            state.owed.remove(slot)  # the last slot (a barrier): forward owes it again
            self._relay.forward(command, slot, Await.RCPT)
            return
        self._out.client_line(command.line, Direction.CLIENT_TO_PROXY)
        slot.barrier = False
        slot.reply = reply or Reply.make(451, "4.7.5", "Error: TLS policy not met")
        slot.direction = Direction.PROXY_TO_CLIENT
        self._relay.flush()
