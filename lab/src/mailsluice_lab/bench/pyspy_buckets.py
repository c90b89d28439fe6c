"""Where a mailsluice process's samples go: a py-spy raw profile summed into buckets.

``py-spy record --format raw --subprocesses -p PID`` of a worker (its session-log writer
is its child) writes one line per distinct stack (``process PID:"cmd";frame;frame... N``).
This sums them per process (worker, log writer) and, per process, into the buckets of
issue 25's breakdown (the handler's write lines are those of ``_perform``'s two
``write`` calls: line numbers of the profiled source), inclusive (a sample counts in
every bucket one of its frames is in, so the shares may add up to more than 100 %);
the first bucket that matches a stack's innermost frame is its "own" bucket (those add
up to 100 %). The log writer's samples are only counted: ``bench callgrind`` tells more.

    python -m mailsluice_lab.bench.pyspy_buckets profile.txt
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

# (bucket, pattern on a frame "function (file:line)"), in the order of precedence
BUCKETS: tuple[tuple[str, str], ...] = (
    ("writes to the transports (handler._perform)",
     r"ConnectionHandler\._perform .*handler\.py:(348|352)\)"),
    ("relay + smtp (the pure core)", r"\(mailsluice/(relay|smtp)/"),
    ("session log in the worker (records, framing)", r"\(mailsluice/sessionlog/|submit_record"),
    ("borrowing, scheduler, destinations",
     r"\(mailsluice/runtime/(borrowing|scheduler|destinations|orders|meters|dialprobe)\.py"),
    ("suspensions, admission", r"\(mailsluice/runtime/(suspensions|admission)\.py|\.admit "),
    ("accept (listener)", r"\(mailsluice/runtime/listener\.py"),
    ("the rest of the shell (handler, sides, mxleg...)", r"\(mailsluice/runtime/"),
    ("JSON (log writer)", r"lines_json|_json_text|\(json/"),
    ("SQLite, unpickling and the rest of write_batch (log writer)", r"write_batch|pickle"),
    ("event loop and the rest", r"."),
)  # fmt: skip
_LINE = re.compile(r"^(.*) (\d+)$")
_PROCESS = re.compile(r'^process \d+:"(.*)"$')


def role(command: str) -> str:
    return "log-writer" if "mailsluice.sessionlog.child" in command else "worker"


def summarise(text: str) -> dict[str, tuple[int, Counter[str], Counter[str]]]:
    """Per role: (samples, inclusive bucket counts, own bucket counts)."""
    out: dict[str, tuple[int, Counter[str], Counter[str]]] = {}
    compiled = [(name, re.compile(pattern)) for name, pattern in BUCKETS]
    for line in text.splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        items, count = match.group(1).split(";"), int(match.group(2))
        # a child's stacks come after its parent's "process" item: the last one is its own
        commands = [m.group(1) for item in items if (m := _PROCESS.match(item))]
        frames = [item for item in items if not _PROCESS.match(item)]
        who = role(commands[-1] if commands else "")
        total, inclusive, own = out.get(who, (0, Counter(), Counter()))
        if who != "worker":  # the log writer: only its own buckets
            frames = [f for f in frames if "sessionlog/" not in f or "sqlite.py" in f]
        hit = {name for name, pattern in compiled if any(pattern.search(f) for f in frames)}
        for name in hit:
            inclusive[name] += count
        innermost = next(
            (name for f in reversed(frames) for name, pattern in compiled if pattern.search(f)),
            "event loop and the rest",
        )
        own[innermost] += count
        out[who] = (total + count, inclusive, own)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m mailsluice_lab.bench.pyspy_buckets PROFILE.txt", file=sys.stderr)
        return 2
    for who, (total, inclusive, own) in sorted(summarise(Path(argv[0]).read_text()).items()):
        print(f"{who}: {total} samples")
        if who != "worker":
            continue  # the log writer: bench callgrind's functions tell more
        for name, _ in BUCKETS:
            if inclusive[name] or own[name]:
                print(
                    f"  {name:<50} inclusive {100 * inclusive[name] / total:5.1f} %"
                    f"  own {100 * own[name] / total:5.1f} %"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
