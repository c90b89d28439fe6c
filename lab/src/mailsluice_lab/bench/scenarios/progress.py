"""Live progress of a bench scenario: messages received per MX, with a bar and msg/s.

On a terminal the display is redrawn in place (one line per MX, ANSI cursor movement,
at most ten redraws a second); on anything else (a file, a pipe, CI logs) it prints a
plain line at most every 5 s. `close()` always prints the final state. Standard library only.

    with Progress({"mx1": 600, "mx2": 600}) as progress:
        while running:
            progress.update(sink_counts())   # {mx: messages received so far}
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TextIO

PLAIN_INTERVAL_S = 5.0
TTY_INTERVAL_S = 0.1
RATE_WINDOW_S = 5.0
BAR_WIDTH = 28
_MAX_NAME = 24


def _columns(stream: TextIO) -> int:
    """The terminal's width (lines longer than it would wrap and break the redraw)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns or 80
    except (AttributeError, ValueError, OSError):
        return 80


def _is_tty(stream: TextIO) -> bool:
    if os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


class Progress:
    """Messages received per MX against the expected totals, shown on ``stream``."""

    def __init__(
        self,
        total_by_mx: Mapping[str, int],
        stream: TextIO | None = None,
        *,
        interactive: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``interactive`` overrides the TTY detection; ``clock`` is for tests."""
        self._stream = stream if stream is not None else sys.stderr
        self._tty = _is_tty(self._stream) if interactive is None else interactive
        self._clock = clock
        self._totals = dict(total_by_mx)
        self._counts = dict.fromkeys(self._totals, 0)
        self._started = clock()
        self._samples: deque[tuple[float, dict[str, int]]] = deque(maxlen=512)
        self._samples.append((self._started, dict(self._counts)))
        self._last_shown: float | None = None
        self._drawn_lines = 0
        self._closed = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def update(self, received_by_mx: Mapping[str, int]) -> None:
        """Record the counts received so far (cumulative) and redraw if it is time to."""
        if self._closed:
            return
        for mx, count in received_by_mx.items():
            self._counts[mx] = max(0, int(count))
        now = self._clock()
        self._samples.append((now, dict(self._counts)))
        while len(self._samples) > 2 and now - self._samples[1][0] >= RATE_WINDOW_S:
            self._samples.popleft()
        interval = TTY_INTERVAL_S if self._tty else PLAIN_INTERVAL_S
        if self._last_shown is None or now - self._last_shown >= interval:
            self._show(now)

    def close(self) -> None:
        """Show the final state (always) and end the display; later updates are ignored."""
        if self._closed:
            return
        self._show(self._clock(), final=True)
        self._closed = True

    def _rate(self, mx: str | None, now: float, final: bool) -> float:
        """msg/s over the recent window (since the start for the final line)."""
        oldest_t, oldest = (self._started, {}) if final else self._samples[0]
        elapsed = now - oldest_t
        if elapsed <= 0:
            return 0.0
        current = sum(self._counts.values()) if mx is None else self._counts.get(mx, 0)
        before = sum(oldest.values()) if mx is None else oldest.get(mx, 0)
        return max(0, current - before) / elapsed

    def _fields(self, mx: str, now: float, final: bool) -> tuple[str, str, str]:
        count, total = self._counts.get(mx, 0), self._totals.get(mx)
        done = f"{count}/{total}" if total is not None else str(count)
        share = f"{100 * min(count, total) / total:3.0f}%" if total else "   -"
        return done, share, f"{self._rate(mx, now, final):.1f} msg/s"

    def _lines(self, now: float, final: bool) -> list[str]:
        width = min(_MAX_NAME, max((len(mx) for mx in self._counts), default=2))
        lines = []
        for mx in self._counts:
            done, share, rate = self._fields(mx, now, final)
            total = self._totals.get(mx)
            filled = round(BAR_WIDTH * min(1.0, self._counts[mx] / total)) if total else 0
            bar = "#" * filled + "." * (BAR_WIDTH - filled)
            lines.append(f"{mx[:width]:<{width}} [{bar}] {share} {done:>15} {rate:>14}")
        total_count, expected = sum(self._counts.values()), sum(self._totals.values())
        elapsed = now - self._started
        lines.append(
            f"{'all':<{width}} {total_count}/{expected} received in {elapsed:.0f} s, "
            f"{self._rate(None, now, final):.1f} msg/s"
        )
        return lines

    def _plain(self, now: float, final: bool) -> str:
        parts = []
        for mx in self._counts:
            done, share, rate = self._fields(mx, now, final)
            parts.append(f"{mx} {done} ({share.strip()}) {rate}")
        head = "done" if final else "progress"
        return f"{head} after {now - self._started:.0f} s: " + "; ".join(parts)

    def _show(self, now: float, final: bool = False) -> None:
        self._last_shown = now
        try:
            if self._tty:
                width = max(20, _columns(self._stream) - 1)
                lines = [line[:width] for line in self._lines(now, final)]
                up = f"\x1b[{self._drawn_lines}F" if self._drawn_lines else ""
                self._stream.write(up + "".join(f"\x1b[2K{line}\n" for line in lines))
                self._drawn_lines = len(lines)
            else:
                self._stream.write(self._plain(now, final) + "\n")
            self._stream.flush()
        except (OSError, ValueError):  # a closed or broken stream must not stop the benchmark
            self._closed = True
