"""The log writer: takes records from the event loop, writes them from a background thread.

``LogWriter`` is also the base of the other writers (:mod:`loopwriter`'s
``LoopPipeWriter``, :mod:`fanout`'s ``LogFanout``, ``NullWriter`` here) and the type
the relay's shell holds; :func:`~mailsluice.sessionlog.writer.open_log` picks one.
It imports only :mod:`interfaces` (the ``Backend`` it writes to).

``LogWriter.submit`` is on the mail path (tens of thousands of calls a second from
the asyncio event-loop thread): it is a length check and a ``deque.append`` and can
neither block nor raise. A daemon thread wakes every ``interval`` seconds (sooner
when the queue grows past ``batch_size``), takes what is waiting and hands it to a
backend's ``write_batch``. Logging never gets in the way of mail: when more than
``queue_limit`` records are waiting, new ones are dropped and counted; when the
backend fails (disk full, locked database), the batch is dropped and counted, the
error goes to ``logging`` at most once per ``error_log_interval`` seconds, and the
writer carries on.

Thread safety: ``deque.append``/``popleft``/``len`` are atomic under the GIL, and each
counter is only ever incremented by one thread (the submitting thread counts queue
overflows, the writer thread everything else), so no lock is taken. ``submit`` is
meant to be called from one thread (the event loop's).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType

from mailsluice.relay.records import Record
from mailsluice.sessionlog.interfaces import Backend, NullBackend

__all__ = ["LogWriter", "NullWriter"]

log = logging.getLogger("mailsluice.sessionlog")


class LogWriter:
    """Batches records in memory and writes them from a background thread."""

    def __init__(
        self,
        backend: Backend,
        *,
        queue_limit: int,
        name: str = "session log",
        interval: float = 0.1,
        batch_size: int = 5000,
        error_log_interval: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if queue_limit < 1:
            raise ValueError(f"queue_limit must be at least 1, got {queue_limit}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self._backend = backend
        self._limit = queue_limit
        self.name = name
        self._interval = interval
        self._batch_size = batch_size
        self._wake_at = max(1, min(batch_size, queue_limit // 2))
        self._error_log_interval = error_log_interval
        self._clock = clock
        self._pending: collections.deque[Record] = collections.deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._closing = False
        # (not ``_thread``: mypyc names the C field ``__thread``, a C keyword)
        self._writer_thread: threading.Thread | None = None
        self._backend_closed = False
        # Counters: _overflow is written by the submitting thread only, the rest by the
        # writer thread only.
        self._overflow = 0
        self._failed_records = 0
        self._written = 0
        self._failed_batches = 0
        # Rate limiting of log messages (writer thread only).
        self._last_error_log: float | None = None
        self._errors_suppressed = 0
        self._last_overflow_log: float | None = None
        self._overflow_logged = 0

    # -- the hot path ---------------------------------------------------------------

    def submit(self, record: Record) -> None:
        """Queue a record for writing; never blocks, never raises (drops when full)."""
        pending = self._pending
        n = len(pending)
        if n >= self._limit or self._closing:
            self._overflow += 1
            return
        pending.append(record)
        if n == self._wake_at:
            self._wake_writer()

    def _wake_writer(self) -> None:
        """Enough records wait: have them written now, not at the next interval."""
        self._wake.set()

    # -- counters -------------------------------------------------------------------

    @property
    def written(self) -> int:
        """Records the backend accepted."""
        return self._written

    @property
    def dropped(self) -> int:
        """Records lost: queue full, submitted after close, or in a failed batch."""
        return self._overflow + self._failed_records

    @property
    def failed_batches(self) -> int:
        """Batches the backend raised on."""
        return self._failed_batches

    @property
    def pending(self) -> int:
        """Records waiting for the writer thread."""
        return len(self._pending)

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        """Start the writer thread (records submitted before are kept, up to the limit)."""
        if self._writer_thread is not None:
            raise RuntimeError("log writer already started")
        if self._closing:
            raise RuntimeError("log writer already closed")
        self._writer_thread = threading.Thread(
            target=self._run, name="mailsluice-log-writer", daemon=True
        )
        self._writer_thread.start()

    def detach(self) -> None:
        """Stop work scheduled on the event loop (none here; see ``LoopPipeWriter``).

        Called from the loop's thread before ``close``, which may run in another."""

    def close(self, timeout: float = 5.0) -> bool:
        """Write what is left, stop the thread and close the backend.

        Returns False when the writer thread did not finish within ``timeout``
        seconds (a stuck backend); the thread is a daemon and will not hold up
        process exit, and what it still held is lost. Records submitted after
        ``close`` are dropped and counted.
        """
        self._closing = True
        thread = self._writer_thread
        if thread is None:  # never started: flush here
            if not self._backend_closed:
                self._drain_all()
                self._close_backend()
            return True
        self._stop.set()
        self._wake.set()
        thread.join(timeout)
        if thread.is_alive():
            log.error(
                "%s: the writer did not finish within %.1f s; %d records still queued are lost",
                self.name,
                timeout,
                len(self._pending),
            )
            return False
        return True

    def __enter__(self) -> LogWriter:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- the writer thread ----------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                self._wake.wait(self._interval)
                self._wake.clear()
                stopping = self._stop.is_set()  # read before draining: nothing is left behind
                self._drain_all()
                self._report_overflow()
                if stopping:
                    break
        finally:
            self._close_backend()

    def _drain_all(self) -> None:
        while self._write_one_batch() == self._batch_size:
            pass

    def _write_one_batch(self) -> int:
        pending = self._pending
        n = min(len(pending), self._batch_size)
        if n == 0:
            return 0
        popleft = pending.popleft
        batch = [popleft() for _ in range(n)]
        try:
            self._backend.write_batch(batch)
        except Exception as exc:  # any backend failure: count, report, carry on
            self._failed_batches += 1
            self._failed_records += n
            self._report_error(exc, n)
        else:
            self._written += n
        return n

    def _report_error(self, exc: Exception, n: int) -> None:
        now = self._clock()
        last = self._last_error_log
        if last is not None and now - last < self._error_log_interval:
            self._errors_suppressed += 1
            return
        suppressed, self._errors_suppressed = self._errors_suppressed, 0
        self._last_error_log = now
        more = f" ({suppressed} more failed batches not reported)" if suppressed else ""
        log.error(
            "%s: cannot write %d records, dropping them: %s: %s%s; "
            "check that the log's destination is reachable and writable (disk space and "
            "permissions of a file, the database or web server) (further errors are "
            "reported at most every %g s)",
            self.name,
            n,
            type(exc).__name__,
            exc,
            more,
            self._error_log_interval,
        )

    def _report_overflow(self) -> None:
        overflow = self._overflow
        if overflow == self._overflow_logged:
            return
        now = self._clock()
        last = self._last_overflow_log
        if last is not None and now - last < self._error_log_interval:
            return
        self._last_overflow_log = now
        log.warning(
            "%s: queue full (log_queue_limit = %d): dropped %d records (%d in total); "
            "the log cannot keep up, use a faster disk or raise log_queue_limit",
            self.name,
            self._limit,
            overflow - self._overflow_logged,
            overflow,
        )
        self._overflow_logged = overflow

    def _close_backend(self) -> None:
        if self._backend_closed:
            return
        self._backend_closed = True
        try:
            self._backend.close()
        except Exception as exc:
            log.error("%s: error closing the log: %s: %s", self.name, type(exc).__name__, exc)


class NullWriter(LogWriter):
    """The writer for ``none:``: accepts records and forgets them (no thread)."""

    def __init__(self) -> None:
        super().__init__(NullBackend(), queue_limit=1, name="none:")

    def submit(self, record: Record) -> None:
        pass

    def start(self) -> None:
        pass

    def close(self, timeout: float = 5.0) -> bool:
        return True
