"""Several worker processes sharing one listening port (``SO_REUSEPORT``).

One Python process uses one core. With ``workers = N`` the parent forks N workers before
any event loop or thread exists; each runs its own ``Proxy`` on the same address (the
kernel spreads new connections over them) with its own log writer thread writing to the
same SQLite file (WAL, one short transaction per batch). The parent only supervises: it
forwards SIGTERM/SIGINT, so every worker shuts down gracefully, and it restarts a worker
that dies unexpectedly (at most once a second). With fair sharing across workers it
first starts the broker (``broker``), restarted like a worker. Under systemd
(``Type=notify``) it sends ``READY=1`` only once every worker serves (``sdnotify``).

SIGHUP (``kill -HUP``, ``systemctl reload``, a closed terminal) stops nothing: it reloads
the configuration. The supervisor reads and checks the file first (``hangup``: an invalid
one is refused once, in its log, and no worker is disturbed), keeps the new settings for
any worker it starts later, and forwards SIGHUP to every worker and to the fair-sharing broker; each
then reads the file itself and reloads (a worker: ``server.Proxy.reload``; the broker:
its scheduler's rules, ``broker._reconfigure``). Why each worker reads it rather than being sent
the settings: there is no channel from the supervisor to a worker but signals, and a
worker's reload is then the very code of a single process's; the file is checked again
by each, so a file changed between the two reads is still refused by a worker, never
half applied. Without a configuration source (settings built in code) SIGHUP is
ignored and said (``HANGUP_NOTICE``). Processes started while SIGHUP is ignored (the
session log's writer) inherit the ignored signal.

Sessions never move between workers; what a worker remembers (TLS failures, its own
outbound sources for loop detection) is its own. A self-redirect loop is still caught:
each hop lands on a random worker and stops as soon as it reaches the one that dialled.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from mailsluice.runtime.process.sdnotify import WorkersReadiness

log = logging.getLogger("mailsluice.workers")
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
#: held back across fork(): the new worker must not run the supervisor's handlers
_FORK_BLOCKED = {*_STOP_SIGNALS, signal.SIGHUP}
#: a worker's exit code for "start me again" (EX_TEMPFAIL): not a failure at start even
#: if it comes early (the broker went away and was restarted meanwhile)
RESTART = 75
HANGUP_NOTICE = (
    "SIGHUP ignored: no configuration file to read again (serve without --config); "
    "restart mailsluice to apply a change"
)


@contextmanager
def hangup_ignored() -> Iterator[None]:
    """SIGHUP ignored for the duration (the previous disposition restored after).

    A process started meanwhile (the session log's writer) inherits the ignored signal,
    so a hang-up sent to the whole process group stops none of ours either."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)


def hangup_ready() -> None:
    """The process handles SIGHUP now (its event loop's handler is installed): one held
    back since it was forked (``supervise``) is delivered."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})


def log_hangup(signum: int = signal.SIGHUP, frame: FrameType | None = None) -> None:
    """The SIGHUP handler where there is nothing to reload: say that it changes nothing."""
    log.warning(HANGUP_NOTICE)


def _stop_with_parent(supervisor: int) -> None:
    """Ask Linux to send us SIGTERM (a graceful stop) if the supervisor dies, so workers
    never outlive a killed supervisor and keep the port. Best effort elsewhere."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != supervisor:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def supervise(
    count: int,
    work: Callable[[int], int],
    helper: Callable[[], int] | None = None,
    on_exit: Callable[[int, int, bool], None] | None = None,
    *,
    hangup: Callable[[], bool] | None = None,
) -> int:
    """Fork ``count`` workers running ``work(number)`` and wait for them; returns the exit
    code. ``helper`` (the fair-sharing broker, the admin server) runs in a process of
    its own, started first and restarted like a worker (it is number -1). ``on_exit(pid,
    number, restarting)`` hears of every child that exited (the metrics). ``hangup``:
    SIGHUP's check in the supervisor; when it says yes, SIGHUP goes on to every worker
    (None: ignored)."""
    stopping = False
    supervisor = os.getpid()
    children: dict[int, int] = {}  # pid -> worker number
    last_start: dict[int, float] = {}

    def spawn(number: int) -> None:
        wait = last_start.get(number, 0.0) + 1.0 - time.monotonic()
        if wait > 0:
            time.sleep(wait)  # crash loop guard: at most one restart a second per worker
        last_start[number] = time.monotonic()
        # A stop signal must not reach the new worker while it still has the supervisor's
        # handler (it would run ``forward`` and then serve on): held back across fork().
        signal.pthread_sigmask(signal.SIG_BLOCK, _FORK_BLOCKED)
        pid = os.fork()
        if pid == 0:  # the worker
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            # SIGHUP stays blocked (pending, not lost: Linux keeps a blocked signal even
            # while ignored) until the child's event loop handles it (``hangup_ready``):
            # a reload the supervisor forwards while a worker starts reaches it
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
            _stop_with_parent(supervisor)
            code = 1
            try:
                code = helper() if number < 0 and helper is not None else work(number)
            except BaseException:
                what = "the broker" if number < 0 else f"worker {number}"
                log.exception("%s failed", what)
            finally:
                sys.stdout.flush()
                os._exit(code)
        children[pid] = number
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORK_BLOCKED)

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if readiness is not None and not stopping:
            readiness.tell("STOPPING=1", "STATUS=stopping: the workers drain their sessions")
        stopping = True
        for pid in list(children):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def reload(signum: int, frame: FrameType | None) -> None:
        if stopping or hangup is None:
            log_hangup()
            return
        if not hangup():
            return
        for pid in list(children):  # the workers, and the broker (its rules)
            try:
                os.kill(pid, signal.SIGHUP)
            except ProcessLookupError:
                pass

    readiness = WorkersReadiness.open()  # READY=1 to systemd once every worker said it
    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, reload)
    status_code = 0
    try:
        if helper is not None:
            spawn(-1)
        for number in range(count):
            spawn(number)
        while children:
            try:
                if readiness is None:
                    pid, status = os.wait()
                else:
                    pid, status = readiness.wait([p for p, n in children.items() if n >= 0])
            except ChildProcessError:
                break
            if pid not in children:
                continue
            number = children.pop(pid)
            code = os.waitstatus_to_exitcode(status)
            early = time.monotonic() - last_start[number] < 5.0
            if on_exit is not None:
                on_exit(pid, number, not stopping and not (early and code not in (0, RESTART)))
            if stopping:
                status_code = max(status_code, code if code > 0 else 0)
                continue
            # a failure soon after start is a start failure (a bad setting, say): starting
            # again would fail again. RESTART asks to be started again, and is not one.
            if early and code not in (0, RESTART):
                log.error("worker %d failed at start (exit %d); stopping", number, code)
                status_code = code
                forward(signal.SIGTERM, None)
                continue
            what = "the broker" if number < 0 else f"worker {number}"
            log.error("%s (pid %d) exited with %d; restarting it", what, pid, code)
            spawn(number)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if readiness is not None:
            readiness.close()
    return status_code
