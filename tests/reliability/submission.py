"""Submitting mail to an MSA (a ``PostfixMSA``) and knowing exactly which messages it took.

Each ``Submission`` carries a unique token in its Message-ID (``mailsluice_lab.peers.ledger.
make_message``). ``submit`` sends a list of them over a few parallel connections, lock-step
(no pipelining, no retries), every read with a deadline, and reports which tokens got a 2xx
at end-of-data and which did not (with the reply or the connection error).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from mailsluice_lab.peers.client import ConnectionClosed, MalformedReply, RawSMTPClient


@dataclass(frozen=True)
class Submission:
    """One message to submit; ``token`` identifies it (it is in the content's Message-ID)."""

    token: str
    sender: str
    recipient: str
    content: bytes


@dataclass(frozen=True)
class SubmitOutcome:
    """Which tokens the MSA accepted (2xx at end-of-data) and which it did not (and why)."""

    accepted: tuple[str, ...]
    refused: tuple[tuple[str, str], ...]


async def _submit_one_connection(
    host: str, port: int, batch: Sequence[Submission], timeout: float
) -> tuple[list[str], list[tuple[str, str]]]:
    accepted: list[str] = []
    refused: list[tuple[str, str]] = []
    done = 0
    try:
        client = await RawSMTPClient.connect(host, port, timeout=timeout)
        async with client:
            greeting = await client.read_reply()
            if greeting.code != 220:
                raise ConnectionError(f"greeting {greeting.as_text()}")
            ehlo = await client.ehlo("submitter.mailsluice.test")
            if ehlo.code != 250:
                raise ConnectionError(f"EHLO: {ehlo.as_text()}")
            for message in batch:
                replies = await client.send_message(
                    message.sender, [message.recipient], message.content
                )
                done += 1
                last = replies[-1]
                if len(replies) == 4 and last.klass == 2:
                    accepted.append(message.token)
                else:
                    refused.append((message.token, last.as_text()))
                    await client.command("RSET")
            await client.quit()
    except (OSError, TimeoutError, ConnectionClosed, MalformedReply, ConnectionError) as exc:
        why = f"submission connection failed: {exc or type(exc).__name__}"
        refused.extend((message.token, why) for message in batch[done:])
    return accepted, refused


async def submit(
    host: str,
    port: int,
    messages: Sequence[Submission],
    *,
    connections: int = 1,
    timeout: float = 30.0,
) -> SubmitOutcome:
    """Submit ``messages`` over ``connections`` parallel connections, lock-step, no retries."""
    connections = max(1, min(connections, len(messages)))
    batches = [messages[i::connections] for i in range(connections)]
    async with asyncio.TaskGroup() as group:
        tasks = [
            group.create_task(_submit_one_connection(host, port, batch, timeout))
            for batch in batches
            if batch
        ]
    accepted: list[str] = []
    refused: list[tuple[str, str]] = []
    for task in tasks:
        ok, bad = task.result()
        accepted.extend(ok)
        refused.extend(bad)
    return SubmitOutcome(accepted=tuple(accepted), refused=tuple(refused))
