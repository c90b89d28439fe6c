"""The process-mode log writer without a thread: the event loop hands batches over.

With ``log_process`` (the default) the real writing (SQLite, PostgreSQL, …) happens in
a child process. Handing batches to it from a writer *thread* cost the mail process
about a tenth of its CPU in GIL hand-offs (measured: ~0.1 ms per message), more than
the work itself. So here the event loop does it: every ``interval`` seconds, or as soon
as ``batch_size`` records wait, a loop callback pickles what is queued (a few µs per
record) and writes the frames to the child's pipe **without blocking**. When the pipe
is full (the child is slow), frames wait in memory, at most ``max_backlog`` bytes;
past that a batch is dropped and counted, never held against mail. A child that died
is replaced (what was in its pipe is lost, counted as a failed batch).

``submit`` is ``LogWriter``'s deque append; only its wake-up differs (a loop
callback). Started outside an event loop (tests, tools) the writer falls back to
``LogWriter``'s thread. ``detach`` (from the
loop thread) stops the loop callbacks; ``close`` then writes what is left, blocking.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections import deque

from mailsluice.sessionlog.pipe import PipeBackend, frame
from mailsluice.sessionlog.threadwriter import LogWriter

__all__ = ["LoopPipeWriter"]

MAX_BACKLOG = 16 << 20  # bytes of frames held for a slow writer process
PIPE_SIZE = 1 << 20  # the pipe's own buffer (Linux's default pipe-max-size)


class LoopPipeWriter(LogWriter):
    """A ``LogWriter`` for a ``PipeBackend`` whose batches leave from the event loop."""

    def __init__(
        self,
        backend: PipeBackend,
        *,
        queue_limit: int,
        name: str,
        interval: float = 0.05,
        batch_size: int = 1000,
        max_backlog: int = MAX_BACKLOG,
    ) -> None:
        super().__init__(
            backend, queue_limit=queue_limit, name=name, interval=interval, batch_size=batch_size
        )
        self._pipe = backend
        self._max_backlog = max_backlog
        self._frames: deque[tuple[memoryview, int]] = deque()  # (bytes left, records in it)
        self._backlog = 0
        self._head_started = False  # part of the first frame is already in the pipe
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._soon = False  # a flush is already scheduled
        self._fd = -1
        self._watching = False  # add_writer is waiting for room in the pipe

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop here: the writer thread does the work
            super().start()
            return
        if self._closing or self._loop is not None:
            raise RuntimeError("log writer already started or closed")
        self._loop = loop
        self._attach_pipe()
        self._timer = loop.call_later(self._interval, self._tick)

    def _wake_writer(self) -> None:
        if self._loop is None:
            super()._wake_writer()  # thread mode
        elif not self._soon:
            self._soon = True
            self._loop.call_soon(self._flush)

    def detach(self) -> None:
        """Stop the loop callbacks (call from the loop's thread before ``close``)."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._watching:
            loop.remove_writer(self._fd)
            self._watching = False

    def close(self, timeout: float = 5.0) -> bool:
        if self._writer_thread is not None or self._backend_closed:
            return super().close(timeout)
        self.detach()
        self._closing = True
        if self._fd >= 0:
            os.set_blocking(self._fd, True)
        try:
            self._frame_pending()
            self._send()
        finally:
            self._close_backend()
        return True

    # -- the loop side --------------------------------------------------------------

    def _attach_pipe(self) -> None:
        child = self._pipe._child
        assert child is not None
        assert child.stdin is not None
        self._fd = child.stdin.fileno()
        os.set_blocking(self._fd, False)
        try:  # room for many flushes: no partial writes, no ping-pong with the reader
            fcntl.fcntl(self._fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:  # over /proc/sys/fs/pipe-max-size for an unprivileged user
            pass

    def _tick(self) -> None:
        self._flush()
        if self._loop is not None:
            self._timer = self._loop.call_later(self._interval, self._tick)

    def _flush(self) -> None:
        self._soon = False
        self._frame_pending()
        self._send()
        self._report_overflow()

    def _frame_pending(self) -> None:
        pending = self._pending
        while pending:
            n = min(len(pending), self._batch_size)
            popleft = pending.popleft
            batch = [popleft() for _ in range(n)]
            data = frame(batch)
            if self._backlog + len(data) > self._max_backlog:
                self._failed_batches += 1
                self._failed_records += n
                self._report_error(BlockingIOError("the log writer process is not keeping up"), n)
                continue
            self._frames.append((memoryview(data), n))
            self._backlog += len(data)

    def _send(self) -> None:
        frames = self._frames
        respawned = False
        while frames:
            view, n = frames[0]
            try:
                sent = os.write(self._fd, view)
            except BlockingIOError:
                self._wait_writable()
                return
            except OSError as exc:  # the writer process is gone: replace it, once
                if respawned:
                    self._drop_all(exc)
                    break
                respawned = True
                self._child_died(exc)
                continue
            self._backlog -= sent
            if sent < len(view):
                frames[0] = (view[sent:], n)
                self._head_started = True
                continue
            frames.popleft()
            self._head_started = False
            self._written += n
        self._stop_watching()

    def _wait_writable(self) -> None:
        if self._loop is not None and not self._watching:
            self._watching = True
            self._loop.add_writer(self._fd, self._send)

    def _stop_watching(self) -> None:
        if self._watching and self._loop is not None:
            self._loop.remove_writer(self._fd)
        self._watching = False

    def _drop_all(self, exc: OSError) -> None:
        """The new writer process failed too: drop what waits (counted), keep going."""
        n = sum(count for _, count in self._frames)
        self._frames.clear()
        self._backlog = 0
        self._head_started = False
        self._failed_batches += 1
        self._failed_records += n
        self._report_error(exc, n)

    def _child_died(self, exc: OSError) -> None:
        if self._head_started:  # its start went to the dead process: the rest is useless
            view, n = self._frames.popleft()
            self._backlog -= len(view)
            self._failed_batches += 1
            self._failed_records += n
            self._head_started = False
            self._report_error(exc, n)
        self._stop_watching()
        self._pipe.respawn()
        self._attach_pipe()
        if self._closing:
            os.set_blocking(self._fd, True)
