"""The message spool: memory then a private temporary file, hard size cap, cleanup."""

from __future__ import annotations

import io
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mailsluice.filtering.api import (
    AddHeader,
    ClientInfo,
    EditHeaders,
    Envelope,
    FilterMessage,
    Verdict,
)
from mailsluice.filtering.chain import DEFAULT_FAILURE, FilterChain
from mailsluice.filtering.spool import MessageSpool

pytestmark = pytest.mark.integration

CLIENT = ClientInfo(
    session_id="s1", client_ip="127.0.0.1", client_port=2525, destination="127.0.0.2:25", helo="x"
)
ENVELOPE = Envelope(mail_from="a@example.com", rcpt_to=("b@example.com",))
RAW = b"Subject: hello\r\nTo: b@example.com\r\n\r\nbody line\r\n.dot line\r\n"
TIMEOUT = 5.0


@dataclass
class AddsX:
    """A filter that adds ``X: 1``, after reading the message or (``read=False``) blindly."""

    read: bool = True
    name: str = "e"

    async def filter(self, message: FilterMessage) -> Verdict:
        if self.read:
            message.raw()
        return EditHeaders(add=(AddHeader("X", "1"),))


def open_files_in(directory: Path) -> list[str]:
    """This process's descriptors that refer to a file in ``directory`` (deleted or not)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory) + "/"):
            found.append(target)
    return found


def test_small_message_stays_in_memory(tmp_path: Path) -> None:
    with MessageSpool(memory_limit=100, size_limit=1000, directory=tmp_path) as spool:
        spool.write(b"Subject: x\r\n\r\n")
        spool.write(b"")
        spool.write(b"body\r\n")
        assert not spool.on_disk
        assert spool.size == 20
        message = spool.as_filter_message(CLIENT, ENVELOPE)
        assert message.raw() == b"Subject: x\r\n\r\nbody\r\n"
        assert message.size == 20
        assert (message.client, message.envelope) == (CLIENT, ENVELOPE)
        assert open_files_in(tmp_path) == []
    assert spool.closed


def test_large_message_moves_to_a_private_deleted_file(tmp_path: Path) -> None:
    chunks = [bytes([65 + i]) * 40 + b"\r\n" for i in range(10)]
    with MessageSpool(memory_limit=100, size_limit=10_000, directory=tmp_path) as spool:
        for chunk in chunks[:2]:
            spool.write(chunk)
        assert (spool.on_disk, spool.size) == (False, 84)
        spool.write(chunks[2])
        assert (spool.on_disk, spool.size) == (True, 126)
        for chunk in chunks[3:]:
            spool.write(chunk)
        assert list(tmp_path.iterdir()) == []  # no name on disk: nothing can be left behind
        [path] = open_files_in(tmp_path)
        assert os.stat(f"/proc/self/fd/{_fd_of(path, tmp_path)}").st_mode & 0o777 == 0o600
        message = spool.as_filter_message(CLIENT, ENVELOPE)
        assert message.size == 420
        assert message.raw() == b"".join(chunks)
        with message.open() as one, message.open() as two:  # independent positions
            assert one.read(42) == chunks[0]
            assert two.read(42) == chunks[0]
            assert one.read(42) == chunks[1]
            one.seek(-42, io.SEEK_END)
            assert one.read() == chunks[-1]
            assert one.read() == b""
    assert open_files_in(tmp_path) == []  # closed: the file is gone


def _fd_of(target: str, directory: Path) -> str:
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == target:
                return fd
        except OSError:
            continue
    raise AssertionError(f"no descriptor for {target} in {directory}")


def test_file_mode_is_0600_even_with_a_lax_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        spool = MessageSpool(memory_limit=0, size_limit=0, directory=tmp_path)
        spool.write(b"x\r\n")
    finally:
        os.umask(old)
    [path] = open_files_in(tmp_path)
    mode = os.stat(f"/proc/self/fd/{_fd_of(path, tmp_path)}").st_mode
    assert stat.S_IMODE(mode) == 0o600
    spool.close()
    spool.close()  # idempotent
    assert open_files_in(tmp_path) == []


def test_reader_outlives_the_spool_until_closed(tmp_path: Path) -> None:
    spool = MessageSpool(memory_limit=4, size_limit=0, directory=tmp_path)
    spool.write(b"hello world\r\n")
    message = spool.as_filter_message(CLIENT, ENVELOPE)
    reader = message.open()
    spool.close()
    assert reader.read() == b"hello world\r\n"
    reader.close()
    assert open_files_in(tmp_path) == []
    with pytest.raises(ValueError, match="closed"):
        message.raw()


def test_size_limit_is_a_hard_cap(tmp_path: Path) -> None:
    with MessageSpool(memory_limit=10, size_limit=30, directory=tmp_path) as spool:
        spool.write(b"a" * 20)
        assert spool.on_disk
        spool.write(b"b" * 10)  # exactly the limit: fine
        assert (spool.exceeded, spool.size) == (False, 30)
        spool.write(b"c")
        # what was stored is dropped
        assert (spool.exceeded, spool.size, spool.on_disk) == (True, 0, False)
        assert open_files_in(tmp_path) == []
        spool.write(b"d" * 5)  # ignored
        assert spool.size == 0
        with pytest.raises(ValueError, match="552"):
            spool.as_filter_message(CLIENT, ENVELOPE)


def test_no_writes_after_handover_or_close(tmp_path: Path) -> None:
    spool = MessageSpool(memory_limit=10, size_limit=0, directory=tmp_path)
    spool.as_filter_message(CLIENT, ENVELOPE)
    with pytest.raises(ValueError, match="closed or already handed-over"):
        spool.write(b"x")
    spool.close()
    with pytest.raises(ValueError, match="closed"):
        spool.as_filter_message(CLIENT, ENVELOPE)
    with pytest.raises(ValueError, match="closed"):
        spool.open()


def test_an_error_closes_the_spool(tmp_path: Path) -> None:
    spool = MessageSpool(memory_limit=2, size_limit=0, directory=tmp_path / "missing")
    spool.write(b"ab")
    with pytest.raises(FileNotFoundError):
        spool.write(b"c")
    assert spool.closed
    with pytest.raises(ValueError, match="closed"):
        spool.write(b"d")


def test_an_exception_in_the_with_block_deletes_the_file(tmp_path: Path) -> None:
    seen: list[int] = []

    def fail_while_spooled() -> None:
        with MessageSpool(memory_limit=1, size_limit=0, directory=tmp_path) as spool:
            spool.write(b"xyz")
            seen.append(len(open_files_in(tmp_path)))
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail_while_spooled()
    assert seen == [1]
    assert open_files_in(tmp_path) == []


def test_negative_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="0 or more"):
        MessageSpool(memory_limit=-1, size_limit=0)


@given(
    st.lists(st.binary(max_size=50), max_size=20),
    st.integers(min_value=0, max_value=200),
    st.integers(min_value=0, max_value=600),
)
def test_spool_keeps_exactly_what_was_written(
    chunks: list[bytes], memory_limit: int, size_limit: int
) -> None:
    total = b"".join(chunks)
    with MessageSpool(memory_limit=memory_limit, size_limit=size_limit) as spool:
        for chunk in chunks:
            spool.write(chunk)
        assert spool.exceeded == bool(size_limit and len(total) > size_limit)
        if spool.exceeded:
            return
        assert spool.on_disk == (len(total) > memory_limit)
        message = spool.as_filter_message(CLIENT, ENVELOPE)
        assert message.raw() == total
        assert message.size == len(total)
        with message.open() as fh:
            assert fh.read() == total


async def test_spooled_message_is_edited(tmp_path: Path) -> None:
    body = b"x" * 5000 + b"\r\n"
    with MessageSpool(memory_limit=100, size_limit=0, directory=tmp_path) as spool:
        spool.write(b"Subject: big\r\n\r\n")
        spool.write(body)
        assert spool.on_disk
        chain = FilterChain([AddsX()], timeout=TIMEOUT)
        outcome = await chain.run(spool.as_filter_message(CLIENT, ENVELOPE))
    assert outcome.message == b"Subject: big\r\nX: 1\r\n\r\n" + body


async def test_unreadable_spool_is_a_failure_not_a_crash(tmp_path: Path) -> None:
    spool = MessageSpool(memory_limit=1, size_limit=0, directory=tmp_path)
    spool.write(RAW)
    spooled = spool.as_filter_message(CLIENT, ENVELOPE)
    spool.close()  # e.g. the session was torn down under us
    blind = AddsX(read=False)
    outcome = await FilterChain([blind], timeout=TIMEOUT).run(spooled)
    assert outcome.reply == DEFAULT_FAILURE
    assert [run.result for run in outcome.runs] == ["invalid"]
