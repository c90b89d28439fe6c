"""A mailing-list manager's SMTP client (Mailman's, or Postfix's own smtp client with VERP).

:func:`send_list` hands one message for many recipients to a server on one connection and
reports, recipient by recipient, what came of it (:class:`~.listoutcome.ListOutcome`):

* ``xverp=""`` (or ``"=-"``, two delimiters): ``MAIL FROM:<sender> XVERP[=xy]`` and the
  recipients, ``batch`` at a time; the server builds each copy's return path. A recipient
  answered ``452 4.5.3`` (too many recipients) goes into the next transaction on the same
  connection, until every recipient has an answer; a server that takes one recipient per
  XVERP transaction (mailsluice) so gets one transaction per recipient.
* ``xverp=None``: what a list manager does without XVERP: one transaction per recipient,
  with the VERP return path built here (:func:`~.listoutcome.verp_address`) and, with
  ``personalise``, a message of its own for each recipient.

With ``pipelining`` (and the server's ``PIPELINING``), MAIL, the RCPTs and DATA go in one
write (RFC 2920), else lock-step. Outcomes: delivered (2xx to end-of-data), deferred (a 4xx
anywhere, the connection lost before the final dot), rejected (5xx), ambiguous (the final
dot was handed to the connection and no reply came: the MX may hold the copy).
:func:`deliver_list` retries the deferred and ambiguous ones, as an MTA's queue does.
Every read has the client's deadline (``timeout``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence

from mailsluice_lab.peers.client import RawSMTPClient, Reply
from mailsluice_lab.peers.listoutcome import (
    DEFAULT_DELIMITERS,
    ListOutcome,
    RcptVerdict,
    RecipientResult,
    Status,
    rcpt_verdict,
    status_of_code,
    verp_address,
    xverp_parameter,
)
from mailsluice_lab.peers.sender import WIRE_ERRORS, dot_stuff

Personalise = Callable[[str], bytes]


class _Closing(Exception):
    """The server is going away (421, or the connection is lost): stop this connection."""

    def __init__(self, code: int | None, reply: str) -> None:
        super().__init__(reply)
        self.code = code
        self.reply = reply


def _reply_text(reply: Reply) -> str:
    return reply.as_text()


def _wire_text(stage: str, exc: BaseException) -> str:
    return f"{stage}: {type(exc).__name__}: {exc}".rstrip(": ")


class _ListSession:
    """One connection's worth of a list delivery."""

    def __init__(self, client: RawSMTPClient, *, pipelining: bool) -> None:
        self.client = client
        self.pipelining = pipelining
        self.results: dict[str, RecipientResult] = {}
        self.transactions = 0

    def decide(self, recipient: str, status: Status, code: int | None, reply: str) -> None:
        self.results[recipient] = RecipientResult(
            recipient, status, code, reply, transaction=self.transactions
        )

    async def read(self) -> Reply:
        return await self.client.read_reply()

    async def transaction(
        self, mail_line: str, rcpts: Sequence[str], content: bytes
    ) -> tuple[list[str], Reply | None]:
        """One transaction: (the recipients to send again, told ``452 4.5.3``; the reply
        to MAIL when it was refused). Raises ``_Closing`` when the connection ends."""
        self.transactions += 1
        rcpt_lines = [f"RCPT TO:<{r}>" for r in rcpts]
        if self.pipelining:
            await self.client.send(
                "".join(f"{line}\r\n" for line in (mail_line, *rcpt_lines, "DATA")).encode()
            )
            mail = await self.read()
            if mail.code == 421:
                raise _Closing(mail.code, _reply_text(mail))
            replies = []
            for _ in rcpts:
                replies.append(await self.read())
                if replies[-1].code == 421:  # the server closes: no more replies
                    break
            data = None if replies and replies[-1].code == 421 else await self.read()
        else:
            mail = await self.client.command(mail_line)
            replies, data = [], None
            if mail.klass == 2:
                for line in rcpt_lines:
                    reply = await self.client.command(line)
                    replies.append(reply)
                    if reply.code == 421 or (
                        rcpt_verdict(reply.code, reply.lines[0]) is RcptVerdict.TOO_MANY
                    ):
                        break  # closing, or the rest would be too many as well
        if mail.klass != 2:
            if mail.code == 421:
                raise _Closing(mail.code, _reply_text(mail))
            return [], mail
        accepted, again = self._judge_rcpts(rcpts, replies)
        if data is None and accepted:
            data = await self.client.command("DATA")
        if data is not None and data.code == 354:
            await self._send_content(accepted, content)
        else:
            if data is not None:
                for rcpt in accepted:
                    self.decide(rcpt, status_of_code(data.code), data.code, _reply_text(data))
                if data.code == 421:
                    raise _Closing(data.code, _reply_text(data))
            await self._rset()
        return again, None

    def _judge_rcpts(
        self, rcpts: Sequence[str], replies: Sequence[Reply]
    ) -> tuple[list[str], list[str]]:
        accepted: list[str] = []
        again: list[str] = []
        for rcpt, reply in zip(rcpts, replies, strict=False):
            verdict = rcpt_verdict(reply.code, reply.lines[0])
            if verdict is RcptVerdict.ACCEPTED:
                accepted.append(rcpt)
            elif verdict is RcptVerdict.TOO_MANY:
                again.append(rcpt)
            else:
                self.decide(rcpt, status_of_code(reply.code), reply.code, _reply_text(reply))
                if reply.code == 421:
                    raise _Closing(reply.code, _reply_text(reply))
        again += list(rcpts[len(replies) :])  # not sent (lock-step after a 452 4.5.3)
        return accepted, again

    async def _send_content(self, accepted: Sequence[str], content: bytes) -> None:
        if not accepted:  # a server that said 354 with no recipient: end it, empty
            await self.client.send(b".\r\n")
            await self.read()
            return
        try:
            await self.client.send(dot_stuff(content))
            reply = await self.read()
        except WIRE_ERRORS as exc:
            # The final dot was handed to the connection: the MX may hold the copies.
            text = _wire_text("after end of data", exc)
            for rcpt in accepted:
                self.decide(rcpt, Status.AMBIGUOUS, None, text)
            raise _Closing(None, text) from exc
        for rcpt in accepted:
            self.decide(rcpt, status_of_code(reply.code), reply.code, _reply_text(reply))
        if reply.code == 421:
            raise _Closing(reply.code, _reply_text(reply))

    async def _rset(self) -> None:
        reply = await self.client.command("RSET")
        if reply.code == 421:
            raise _Closing(reply.code, _reply_text(reply))


async def _open(
    host: str, port: int, *, timeout: float, helo: str, source: str | None
) -> tuple[RawSMTPClient, tuple[str, ...]]:
    """Connect, greeting, EHLO (HELO if refused): the client and the EHLO keywords.
    Raises ``_Closing`` with the reason when there is no session to be had."""
    try:
        client = await RawSMTPClient.connect(
            host, port, timeout=timeout, source=source, transcript=False
        )
    except (OSError, TimeoutError) as exc:
        raise _Closing(None, _wire_text("connect", exc)) from exc
    try:
        greeting = await client.read_reply()
        if greeting.code != 220:
            raise _Closing(greeting.code, _reply_text(greeting))
        ehlo = await client.ehlo(helo)
        if ehlo.code == 250:
            return client, tuple(line.split(" ", 1)[0].upper() for line in ehlo.lines[1:])
        hello = await client.command(f"HELO {helo}")
        if hello.code != 250:
            raise _Closing(hello.code, _reply_text(hello))
        return client, ()
    except WIRE_ERRORS as exc:
        client.close()
        raise _Closing(None, _wire_text("greeting", exc)) from exc
    except _Closing:
        client.close()
        raise


async def send_list(
    host: str,
    port: int,
    *,
    sender: str,
    recipients: Sequence[str],
    message: bytes,
    xverp: str | None = "",
    personalise: Personalise | None = None,
    delimiters: str = DEFAULT_DELIMITERS,
    mail_params: Sequence[str] = (),
    pipelining: bool = True,
    batch: int = 50,
    timeout: float = 30.0,
    helo: str = "lists.example",
    source: str | None = None,
) -> ListOutcome:
    """Deliver ``message`` to ``recipients`` on one connection; see the module docstring.

    ``xverp``: the XVERP delimiters to ask for (``""``: the server's defaults), or None
    for one transaction per recipient with the return path ``verp_address(sender, rcpt,
    delimiters)`` and the content ``personalise(rcpt)`` (``message`` without it).
    ``mail_params`` go on every MAIL command; at most ``batch`` RCPTs per transaction.
    """
    if batch < 1:
        raise ValueError("batch must be at least 1")
    wanted = list(dict.fromkeys(recipients))
    try:
        opened, capabilities = await _open(host, port, timeout=timeout, helo=helo, source=source)
    except _Closing as refused:
        code = refused.code
        status = Status.DEFERRED if code is None else status_of_code(code)
        results = tuple(RecipientResult(r, status, code, refused.reply) for r in wanted)
        return ListOutcome(results, results, transactions=0, connections=1)
    session = _ListSession(opened, pipelining=pipelining and "PIPELINING" in capabilities)
    try:
        if xverp is None:
            await _personalised(session, sender, wanted, message, personalise, delimiters,
                                mail_params)  # fmt: skip
        else:
            await _with_xverp(session, sender, wanted, message, xverp, mail_params, batch)
        with contextlib.suppress(*WIRE_ERRORS):
            async with asyncio.timeout(timeout):
                await opened.quit()
    except _Closing as closing:
        _finish(session, wanted, Status.DEFERRED, closing.code, closing.reply)
    except WIRE_ERRORS as exc:
        _finish(session, wanted, Status.DEFERRED, None, _wire_text("before end of data", exc))
    finally:
        opened.close()
    results = tuple(session.results[r] for r in wanted)
    return ListOutcome(
        results, results, transactions=session.transactions, connections=1,
        capabilities=capabilities,
    )  # fmt: skip


def _finish(
    session: _ListSession, wanted: Sequence[str], status: Status, code: int | None, text: str
) -> None:
    """Every recipient still without an answer gets this one."""
    for rcpt in wanted:
        if rcpt not in session.results:
            session.decide(rcpt, status, code, text)


def _mail_line(sender: str, params: Sequence[str]) -> str:
    return " ".join((f"MAIL FROM:<{sender}>", *params))


async def _with_xverp(
    session: _ListSession,
    sender: str,
    wanted: Sequence[str],
    message: bytes,
    xverp: str,
    mail_params: Sequence[str],
    batch: int,
) -> None:
    mail_line = _mail_line(sender, (xverp_parameter(xverp), *mail_params))
    pending = list(wanted)
    while pending:
        chunk, rest = pending[:batch], pending[batch:]
        again, refused = await session.transaction(mail_line, chunk, message)
        if refused is not None:  # the same MAIL would be refused again: all of them
            status = status_of_code(refused.code)
            _finish(session, wanted, status, refused.code, _reply_text(refused))
            return
        if len(again) == len(chunk):  # no recipient got anywhere: do not loop
            text = f"no progress: every RCPT of transaction {session.transactions} was 452"
            _finish(session, wanted, Status.DEFERRED, 452, text)
            return
        pending = again + rest


async def _personalised(
    session: _ListSession,
    sender: str,
    wanted: Sequence[str],
    message: bytes,
    personalise: Personalise | None,
    delimiters: str,
    mail_params: Sequence[str],
) -> None:
    for rcpt in wanted:
        mail_line = _mail_line(verp_address(sender, rcpt, delimiters), mail_params)
        content = personalise(rcpt) if personalise is not None else message
        again, refused = await session.transaction(mail_line, [rcpt], content)
        if refused is not None:
            session.decide(rcpt, status_of_code(refused.code), refused.code, refused.as_text())
        elif again:
            session.decide(rcpt, Status.DEFERRED, 452, "452 to the only RCPT of a transaction")


async def deliver_list(
    send: Callable[[Sequence[str]], Awaitable[ListOutcome]],
    recipients: Sequence[str],
    *,
    attempts: int = 5,
    retry_delay: float = 0.05,
) -> ListOutcome:
    """``send(recipients)`` (a :func:`send_list` with its options bound), then again for
    the deferred and ambiguous recipients, ``retry_delay`` apart, at most ``attempts``
    times in all, as an MTA's queue retries::

        outcome = await deliver_list(
            lambda rcpts: send_list(host, port, sender=s, recipients=rcpts, message=m),
            recipients,
        )
    """
    outcome = await send(recipients)
    for _ in range(attempts - 1):
        unfinished = outcome.unfinished
        if not unfinished:
            break
        await asyncio.sleep(retry_delay)
        outcome = outcome.then(await send(unfinished))
    return outcome
