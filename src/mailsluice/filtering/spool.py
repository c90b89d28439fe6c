"""The message spool of one transaction in filter mode: memory first, then a private file.

``MessageSpool`` takes the message bytes (canonical, dot-stuffing already removed) as the
body scanner lets them through, keeps them in memory up to ``memory_limit`` bytes, then
moves them to an anonymous temporary file: created mode 0600 in ``directory`` (default: the
system temporary directory), unlinked at once (``tempfile.TemporaryFile``), so it is gone
when the spool is closed, when the process dies, and on any error. ``size_limit`` is a hard
cap: a write past it sets ``exceeded``, drops what was stored and stores nothing more (the
relay answers ``552 5.3.4``; the body scanner normally refuses such a message first).

Writes are synchronous: the chunks are at most a read buffer long and go to the page
cache, so a ``write`` costs microseconds and the event loop is not held up. A disk error
(``OSError``) closes the spool and propagates: the relay answers 4xx.

Use it as a context manager (or call :meth:`close`)::

    with MessageSpool(memory_limit=1 << 20, size_limit=limit) as spool:
        spool.write(chunk) ...
        outcome = await chain.run(spool.as_filter_message(client, envelope))
"""

from __future__ import annotations

import io
import os
import tempfile
from types import TracebackType
from typing import IO, BinaryIO

from mailsluice.filtering.api import ClientInfo, Envelope, FilterMessage

__all__ = ["MessageSpool"]


class _SpoolReader(io.RawIOBase):
    """A read-only view of the spool file with its own position (``os.pread`` on a
    duplicate descriptor), so readers never disturb each other or the spool, and stay
    valid after the spool is closed until they are closed themselves."""

    def __init__(self, fd: int, size: int) -> None:
        super().__init__()
        self._fd = os.dup(fd)
        self._size = size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        if self.closed:
            raise ValueError("read from a closed spool reader")
        want = min(len(buffer), self._size - self._pos)
        if want <= 0:
            return 0
        data = os.pread(self._fd, want, self._pos)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


class MessageSpool:
    """The bytes of one message: in memory up to ``memory_limit``, then in a 0600 temp file.

    ``size_limit`` 0 means no cap (as ``BodyScanner``'s); memory use is bounded by
    ``memory_limit`` either way.
    """

    __slots__ = (
        "_buffer",
        "_closed",
        "_directory",
        "_exceeded",
        "_file",
        "_memory_limit",
        "_sealed",
        "_size",
        "_size_limit",
    )

    def __init__(
        self,
        *,
        memory_limit: int,
        size_limit: int,
        directory: str | os.PathLike[str] | None = None,
    ) -> None:
        if memory_limit < 0 or size_limit < 0:
            raise ValueError("spool limits must be 0 or more bytes (size_limit 0: no cap)")
        self._memory_limit = memory_limit
        self._size_limit = size_limit
        self._directory = directory
        self._buffer = bytearray()
        self._file: IO[bytes] | None = None
        self._size = 0
        self._exceeded = False
        self._sealed = False
        self._closed = False

    @property
    def size(self) -> int:
        """Message bytes stored (0 once ``exceeded``)."""
        return self._size

    @property
    def exceeded(self) -> bool:
        """More than ``size_limit`` bytes were written: the message must be refused."""
        return self._exceeded

    @property
    def on_disk(self) -> bool:
        """The message went past ``memory_limit`` and lives in the temporary file."""
        return self._file is not None

    @property
    def closed(self) -> bool:
        return self._closed

    def write(self, data: bytes) -> None:
        """Append message bytes. Past ``size_limit``: nothing is kept, ``exceeded`` is set."""
        if self._closed or self._sealed:
            raise ValueError("write to a closed or already handed-over message spool")
        if self._exceeded or not data:
            return
        size = self._size + len(data)
        if self._size_limit and size > self._size_limit:
            self._exceeded = True
            self._release()
            return
        try:
            if self._file is None and size > self._memory_limit:
                self._to_file()
            if self._file is not None:
                self._file.write(data)
            else:
                self._buffer += data
        except BaseException:
            self.close()
            raise
        self._size = size

    def _to_file(self) -> None:
        handle = tempfile.TemporaryFile(mode="w+b", dir=self._directory)  # noqa: SIM115
        self._file = handle  # first, so that close() closes it if the write below fails
        handle.write(self._buffer)
        self._buffer = bytearray()

    def _release(self) -> None:
        self._buffer = bytearray()
        self._size = 0
        if self._file is not None:
            self._file.close()
            self._file = None

    def as_filter_message(self, client: ClientInfo, envelope: Envelope) -> FilterMessage:
        """The message for the filters: the bytes when in memory, a file opener when on
        disk. No writes are accepted afterwards."""
        if self._closed:
            raise ValueError("the message spool is closed")
        if self._exceeded:
            raise ValueError("the message exceeded size_limit: refuse it (552 5.3.4)")
        self._sealed = True
        if self._file is None:
            return FilterMessage(client=client, envelope=envelope, raw=bytes(self._buffer))
        try:
            self._file.flush()
        except BaseException:
            self.close()
            raise
        return FilterMessage(client=client, envelope=envelope, opener=self.open, size=self._size)

    def open(self) -> BinaryIO:
        """A new reader of the stored message, from the start (close it when done)."""
        if self._closed:
            raise ValueError("the message spool is closed")
        if self._file is None:
            return io.BytesIO(bytes(self._buffer))
        self._file.flush()
        return io.BufferedReader(_SpoolReader(self._file.fileno(), self._size))

    def close(self) -> None:
        """Forget the message; the temporary file (if any) is deleted. Idempotent."""
        self._closed = True
        self._buffer = bytearray()
        handle, self._file = self._file, None
        if handle is not None:
            handle.close()

    def __enter__(self) -> MessageSpool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
