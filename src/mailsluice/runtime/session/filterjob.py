"""One message in filter mode, on the I/O side: spool it, run the chain, send the result.

The relay (``relay.filtered``) decides *when*; this does the work it asks for:
``SpoolData`` goes to a ``MessageSpool`` (memory, then a private temporary file),
``RunFilters`` runs the ``FilterChain`` and answers ``FilterDecided``, ``SendSpooled``
streams the message (edited, replaced or as received) dot-stuffed to the MX, then the
end-of-data marker; ``DropSpool`` or the session's end deletes the spool.

Reading the spool file happens on the event loop thread in 64 KiB pieces: a local,
freshly written temporary file is in the page cache, and each piece is followed by a
wait for the MX to take it (transport flow control), so memory stays bounded.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator

from mailsluice.filtering.api import ClientInfo, Envelope
from mailsluice.filtering.chain import FilterChain, Outcome
from mailsluice.filtering.message import iter_dot_stuffed
from mailsluice.filtering.splice import Spliced
from mailsluice.filtering.spool import MessageSpool
from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.settings.filters import MAX_FILTER_TIMEOUT, FilteringSettings

__all__ = ["FilterDriver", "FilterJob", "send_message"]

log = logging.getLogger("mailsluice.filtering")

READ_SIZE = 64 * 1024
END_OF_DATA = b".\r\n"
SPOOL_SLACK = 65536  # the spool's cap over the message size limit (the scanner refuses first)


class FilterJob:
    """The spool and the verdict of one message."""

    def __init__(self, *, memory_limit: int, size_limit: int, spool_dir: str | None) -> None:
        # The relay's scanner refuses a message over the limit before this cap is reached;
        # the spool's own cap is the backstop that bounds the disk.
        self._spool = MessageSpool(
            memory_limit=memory_limit, size_limit=size_limit, directory=spool_dir or None
        )
        self.outcome: Outcome | None = None

    def add(self, data: bytes) -> None:
        self._spool.write(data)

    async def decide(
        self, chain: FilterChain, client: ClientInfo, run: act.RunFilters
    ) -> ev.FilterDecided:
        """Run the chain; the verdict as the relay's event. Never raises for a filter's
        fault (the chain applies the failure policy); cancellation propagates."""
        if self._spool.exceeded:
            return ev.FilterDecided((552, "5.3.4 Error: message exceeds the size limit"))
        envelope = Envelope(
            mail_from=run.mail_from,
            rcpt_to=run.rcpt_to,
            mail_params=run.mail_params,
            transaction=run.transaction,
        )
        outcome = await chain.run(self._spool.as_filter_message(client, envelope))
        self.outcome = outcome
        if outcome.reply is None:
            edited = [r.name for r in outcome.runs if r.result in ("edit", "replace")]
            return ev.FilterDecided(None, ", ".join(edited))
        return ev.FilterDecided((outcome.reply.code, outcome.reply.text), outcome.decided_by)

    def wire_chunks(self) -> Iterator[bytes]:
        """The message as it goes after DATA: dot-stuffed, then ``.`` CRLF."""
        outcome = self.outcome
        if outcome is not None and outcome.message is not None:
            yield from iter_dot_stuffed((outcome.message,))
        else:
            yield from iter_dot_stuffed(self._spooled(outcome.spliced if outcome else None))
        yield END_OF_DATA

    def _spooled(self, spliced: Spliced | None) -> Iterator[bytes]:
        """The spooled message in pieces; after header edits, the new head first."""
        with self._spool.open() as reader:
            if spliced is not None:
                yield spliced.head
                reader.seek(spliced.body_from)
            yield from iter(lambda: reader.read(READ_SIZE), b"")

    def close(self) -> None:
        self._spool.close()


async def send_message(
    job: FilterJob, write: Callable[[bytes], bool], writable: asyncio.Event
) -> None:
    """Write the job's message to the MX piece by piece, waiting while its buffer is full.

    ``write`` returns False once the MX connection is gone: sending stops (the relay
    has already turned that into a 4xx for the client).
    """
    for chunk in job.wire_chunks():
        if not write(chunk):
            return
        await writable.wait()


class FilterDriver:
    """A session's filter-mode state: the current job, and the chain run it may cancel.
    ``filtering`` says where the spool goes and the reply when the filters fail;
    ``size_limit`` is the relay's message size limit (the spool's cap is just over it)."""

    def __init__(
        self,
        filtering: FilteringSettings,
        size_limit: int,
        chain: FilterChain | None,
        *,
        writable: bool = True,
    ) -> None:
        self._filtering = filtering
        self._size_limit = size_limit
        self._writable = asyncio.Event()  # the MX's write buffer has room
        if writable:
            self._writable.set()
        self._chain = chain
        self._job: FilterJob | None = None
        self._scope: asyncio.Timeout | None = None  # the running chain; ``cancel`` ends it
        self._cancelled = False
        self._budget = MAX_FILTER_TIMEOUT

    def spool(self, data: bytes) -> None:
        job = self._job
        if job is None:
            filtering = self._filtering
            job = self._job = FilterJob(
                memory_limit=filtering.memory_limit,
                size_limit=self._size_limit + SPOOL_SLACK,
                spool_dir=filtering.spool_dir,
            )
        job.add(data)

    async def run(
        self,
        run: act.RunFilters,
        *,
        session_id: str,
        peer: tuple[str, int] | None,
        destination: str,
        source_ip: str | None,
    ) -> ev.FilterDecided | None:
        """``RunFilters`` for the session: ``decide`` with what the filters are told of
        its client (``peer``: its address, None when it is gone)."""
        client = ClientInfo(
            session_id=session_id,
            client_ip=peer[0] if peer else "",
            client_port=peer[1] if peer else 0,
            destination=destination,
            helo=run.helo,
            source_ip=source_ip,
        )
        return await self.decide(run, client)

    async def decide(self, run: act.RunFilters, client: ClientInfo) -> ev.FilterDecided | None:
        """The verdict, or None when ``cancel`` ended the run (the session is over).

        Each filter has its own timeout (the chain's); the whole chain gets at most
        ``MAX_FILTER_TIMEOUT`` seconds (the client's patience for its end-of-data reply
        must hold the filters, DATA and the MX's reply), then the failure policy applies.
        """
        if self._job is None:  # an empty message: nothing was spooled
            self._job = FilterJob(memory_limit=0, size_limit=0, spool_dir=None)
        if self._chain is None:  # filter mode without a chain: a bug of ours
            raise RuntimeError("filter mode without a filter chain")
        self._cancelled = False
        try:
            async with asyncio.timeout(self._budget) as scope:
                self._scope = scope
                return await self._job.decide(self._chain, client, run)
        except TimeoutError:
            if self._cancelled:
                return None
            log.warning(
                "session %s: the filters took more than %g s in all; %d %s",
                client.session_id, self._budget, *self._filtering.failure_reply,
            )  # fmt: skip
            return ev.FilterDecided(self._filtering.failure_reply, "filter chain")
        finally:
            self._scope = None

    def cancel(self) -> None:
        scope = self._scope
        if scope is not None and not scope.expired():
            self._cancelled = True
            scope.reschedule(asyncio.get_running_loop().time())

    def server_writable(self, writable: bool) -> None:
        if writable:
            self._writable.set()
        else:
            self._writable.clear()

    async def send(self, write: Callable[[bytes], bool]) -> None:
        job = self._job
        if job is None:
            return
        try:
            await send_message(job, write, self._writable)
        finally:
            self.drop()  # all sent (or the MX is gone); its reply decides, as always

    def drop(self) -> None:
        job, self._job = self._job, None
        if job is not None:
            job.close()
