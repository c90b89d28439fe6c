"""Chaos: a real Postfix MSA sends through mailsluice while mailsluice is SIGKILLed repeatedly.

A private Postfix instance (``mailsluice_lab.postfix``, fast retries) relays everything to
``mailsluice serve --upstream`` (a subprocess, SQLite session log), which relays to the lab's
MX on the test's event loop (``ScriptedMX``: its ledger records each message, which it stores
before it waits a moment and answers). Messages with
unique Message-IDs are submitted to Postfix in small batches spread over the whole run while
a loop starts mailsluice, lets it work for 0.5-1.5 s, kills it with SIGKILL and starts it
again, at least ``kills`` times. Then mailsluice is left running until Postfix's queue drains.

Checked: every message Postfix accepted reached the MX at least once (duplicates are allowed,
counted and bounded: only a kill between the MX's 250 and Postfix hearing it makes one),
nothing unknown reached the MX, Postfix's queue ends empty, its log has no ``status=bounced``
or ``status=expired``, the kills really disturbed deliveries (``status=deferred`` seen), and
the session log is still readable.

Default: 200 messages, 5 kills (``MAILSLUICE_CHAOS_MESSAGES`` / ``MAILSLUICE_CHAOS_KILLS``);
``test_chaos_full`` (marker ``slow``): 1,000 messages, 12 kills. Root and Postfix required.
"""

from __future__ import annotations

import asyncio
import collections
import math
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.reliability.envsize import env_int
from tests.reliability.proxy_process import helpers, serve
from tests.reliability.submission import Submission, submit

from mailsluice_lab.peers.ledger import make_message, new_token
from mailsluice_lab.peers.mx import ScriptedMX
from mailsluice_lab.postfix import PostfixMSA, missing
from mailsluice_lab.processes import free_port, is_alive

pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(missing() is not None, reason=str(missing())),
]

DEFAULT_MESSAGES = env_int("MAILSLUICE_CHAOS_MESSAGES", 200)
DEFAULT_KILLS = env_int("MAILSLUICE_CHAOS_KILLS", 5)
SEED = env_int("MAILSLUICE_CHAOS_SEED", random.SystemRandom().randrange(1, 2**31), minimum=0)
FULL_MESSAGES = 1_000
FULL_KILLS = 12
#: Postfix's default per-destination concurrency: at most this many deliveries are in flight
#: through mailsluice when it is killed, so at most this many duplicates per kill.
POSTFIX_CONCURRENCY = 20
UP_SECONDS = (0.5, 1.5)  # how long each mailsluice instance lives before its SIGKILL
BATCH_PAUSE = 0.2  # seconds between submission batches
#: The MX stores a message, then waits this long before its 250: kills land in that window.
DOT_DELAY = (0.02, 0.2)


def budget_seconds(messages: int, kills: int) -> float:
    """Hard limit for one run: start-up, the kill loop, the drain, teardown."""
    return 60.0 + kills * 4.0 + messages / 20


@dataclass
class ChaosLog:
    """What the kill loop did."""

    kills: int = 0
    starts: int = 0
    orphaned_writers: int = 0  # log-writer processes still alive 5 s after their proxy's kill


async def _kill_loop(
    workdir: Path,
    *,
    port: int,
    mx_port: int,
    db: Path,
    kills: int,
    submitted: asyncio.Event,
    rng: random.Random,
    record: ChaosLog,
    groups: list[int],
) -> None:
    """Start mailsluice, let it run 0.5-1.5 s, SIGKILL it; until ``kills`` kills and the
    submission has finished (at most 3x ``kills`` + 10 kills)."""
    limit = 3 * kills + 10
    while record.kills < limit and not (record.kills >= kills and submitted.is_set()):
        async with serve(workdir, port=port, upstream_port=mx_port, db=db, tag="chaos") as proc:
            groups.append(proc.pid)
            record.starts += 1
            await asyncio.sleep(rng.uniform(*UP_SECONDS))
            writers = helpers(proc.pid)
            proc.send_signal(signal.SIGKILL)  # the proxy only: its log writer must notice
            await proc.wait()
            record.kills += 1
            deadline = time.monotonic() + 5.0
            while any(is_alive(w) for w in writers) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            record.orphaned_writers += sum(is_alive(w) for w in writers)
        # leaving serve() SIGKILLs the process group: nothing of this instance survives


async def _submit_paced(
    msa: PostfixMSA, messages: list[Submission], batch: int, submitted: asyncio.Event
) -> tuple[list[str], list[tuple[str, str]]]:
    accepted: list[str] = []
    refused: list[tuple[str, str]] = []
    try:
        for start in range(0, len(messages), batch):
            outcome = await submit(
                msa.host, msa.port, messages[start : start + batch], connections=2
            )
            accepted.extend(outcome.accepted)
            refused.extend(outcome.refused)
            await asyncio.sleep(BATCH_PAUSE)
    finally:
        submitted.set()
    return accepted, refused


def _deferred(maillog: str, reason: str) -> int:
    return sum(1 for line in maillog.splitlines() if "status=deferred" in line and reason in line)


async def chaos(
    workdir: Path,
    messages: int,
    kills: int,
    figures: dict[str, Any],
    groups: list[int],
    request: pytest.FixtureRequest,
) -> None:
    rng = random.Random(SEED)
    figures.update(messages=messages, kills_wanted=kills, seed=SEED)
    run_id = new_token("chaos")[:14]
    batch = max(1, math.ceil(messages * BATCH_PAUSE / (kills * 1.5)))
    mail = []
    for number in range(messages):
        token = f"{run_id}-{number:05d}"
        mail.append(
            Submission(
                token=token,
                sender=f"tenant{number % 7}@client.test",
                recipient=f"rcpt{number}@mx.test",
                content=make_message(token, subject=f"chaos {number}"),
            )
        )
    db = workdir / "sessions.db"
    proxy_port = free_port()
    record = ChaosLog()
    started = time.monotonic()
    async with asyncio.timeout(budget_seconds(messages, kills)):
        chaos_mx = ScriptedMX(
            stored_reply_delay=DOT_DELAY, seed=SEED, idle_timeout=60.0, transcript=False
        )
        async with chaos_mx as mx:
            msa = PostfixMSA(
                relayhost=("127.0.0.1", proxy_port),
                name="chaos",
                settings={"default_destination_concurrency_limit": str(POSTFIX_CONCURRENCY)},
            )
            request.addfinalizer(msa.stop)  # safety net if the run is cut short
            async with msa:
                submitted = asyncio.Event()
                async with asyncio.TaskGroup() as group:
                    sending = group.create_task(_submit_paced(msa, mail, batch, submitted))
                    group.create_task(
                        _kill_loop(
                            workdir, port=proxy_port, mx_port=mx.port, db=db, kills=kills,
                            submitted=submitted, rng=rng, record=record, groups=groups,
                        )
                    )  # fmt: skip
                accepted, refused = sending.result()
                chaos_done = time.monotonic()
                async with serve(
                    workdir, port=proxy_port, upstream_port=mx.port, db=db, tag="chaos"
                ) as final:
                    groups.append(final.pid)
                    await asyncio.to_thread(msa.flush)
                    try:
                        await msa.wait_queue_empty(timeout=90)
                    except TimeoutError:
                        pytest.fail(
                            f"Postfix's queue did not drain within 90 s of the last kill: "
                            f"{len(await asyncio.to_thread(msa.queue))} messages left; "
                            f"log: {msa.log_tail()}"
                        )
                    queue_left = await asyncio.to_thread(msa.queue)
                figures["mailsluice_final_exit"] = final.returncode
                deliveries = msa.deliveries()
                maillog = msa.maillog.read_text(errors="replace")
            stored = [message.message_id for message in mx.ledger]
            aborted = sum(session.ended_in_data for session in mx.sessions)
            figures.update(mx_sessions=len(mx.sessions), mx_aborted_in_body=aborted)
    ended = time.monotonic()

    per_id = collections.Counter(stored)
    wanted = {f"<{token}@test>" for token in accepted}
    lost = sorted(w for w in wanted if per_id[w] == 0)
    unknown = sorted(str(s) for s in per_id if s not in wanted)
    duplicates = sum(count - 1 for key, count in per_id.items() if key in wanted and count > 1)
    figures.update(
        kills_survived=record.kills,
        mailsluice_starts=record.starts + 1,
        accepted_by_postfix=len(accepted),
        delivered_unique=len(wanted) - len(lost),
        delivered_total=len(stored),
        duplicates=duplicates,
        lost=len(lost),
        bounced=deliveries.bounced + deliveries.expired,
        deferred_attempts=deliveries.deferred,
        deferred_connection_refused=_deferred(maillog, "Connection refused"),
        deferred_lost_connection=_deferred(maillog, "lost connection"),
        orphaned_log_writers=record.orphaned_writers,
        seconds_chaos=round(chaos_done - started, 1),
        seconds_total=round(ended - started, 1),
    )

    assert not refused, f"Postfix refused {len(refused)} submissions, e.g. {refused[:3]}"
    assert len(accepted) == messages
    assert record.kills >= kills, f"only {record.kills} of {kills} kills happened"
    assert not lost, f"LOST: {len(lost)} accepted messages never reached the MX: {lost[:10]}"
    assert not unknown, f"the MX holds messages nobody submitted: {unknown[:10]}"
    assert not queue_left, f"Postfix's queue is not empty: {queue_left[:3]}"
    bounces = "\n".join(deliveries.bounced_lines[:10])
    assert deliveries.bounced == 0, f"Postfix bounced mail:\n{bounces}"
    assert deliveries.expired == 0, f"Postfix gave up on mail:\n{bounces}"
    assert duplicates <= record.kills * POSTFIX_CONCURRENCY, (
        f"{duplicates} duplicates for {record.kills} kills: more than the deliveries that "
        "can be in flight when a kill lands"
    )
    assert deliveries.deferred > 0, "no delivery was ever deferred: the kills hit nothing"
    assert record.orphaned_writers == 0, (
        f"{record.orphaned_writers} session-log writer processes outlived their SIGKILLed proxy"
    )
    assert final.returncode == 0, f"the last mailsluice exited with {final.returncode}"
    log = (workdir / "mailsluice-chaos.log").read_text(errors="replace")
    assert "Traceback" not in log, f"mailsluice logged a traceback: {log[-2000:]}"
    listing = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "mailsluice", "sessions", "--json", "--limit", "5",
         "--log", f"sqlite:{db}"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert listing.returncode == 0, f"session log unreadable after the kills: {listing.stderr}"
    assert listing.stdout.strip(), "the session log is empty after the run"


@pytest.mark.timeout(budget_seconds(DEFAULT_MESSAGES, DEFAULT_KILLS) + 60)
async def test_chaos(
    tmp_path: Path,
    figures: dict[str, Any],
    process_groups: list[int],
    request: pytest.FixtureRequest,
) -> None:
    await chaos(tmp_path, DEFAULT_MESSAGES, DEFAULT_KILLS, figures, process_groups, request)


@pytest.mark.slow
@pytest.mark.timeout(budget_seconds(FULL_MESSAGES, FULL_KILLS) + 60)
async def test_chaos_full(
    tmp_path: Path,
    figures: dict[str, Any],
    process_groups: list[int],
    request: pytest.FixtureRequest,
) -> None:
    await chaos(tmp_path, FULL_MESSAGES, FULL_KILLS, figures, process_groups, request)


def test_postfix_msa_stops_cleanly_and_leaves_nothing(tmp_path: Path) -> None:
    """The MSA helper itself: it greets, its queue is readable, and stop() leaves no process."""
    msa = PostfixMSA(relayhost=("127.0.0.1", free_port()), name="lifecycle")
    with msa:
        assert msa.queue() == []
        assert msa.master_pid
        assert is_alive(msa.master_pid)
        assert msa.processes(), "no Postfix process works in the instance directory"
    assert not msa.processes(), "Postfix processes survived stop()"
    assert not msa.root.exists()
    assert not is_alive(msa.master_pid)


async def test_a_real_bounce_is_detected(request: pytest.FixtureRequest) -> None:
    """The "none bounced" check is live: a 550 from the MX shows up as a bounce in the log."""
    token = new_token("bounce")
    message = Submission(token, "tenant@client.test", "nobody@mx.test", make_message(token))
    async with ScriptedMX(reject_rcpt="nobody", transcript=False) as mx:
        msa = PostfixMSA(relayhost=("127.0.0.1", mx.port), name="bounce")
        request.addfinalizer(msa.stop)
        async with msa:
            outcome = await submit(msa.host, msa.port, [message])
            assert outcome.accepted == (token,)
            await msa.wait_queue_empty(timeout=30)
            deliveries = msa.deliveries()
    assert deliveries.bounced == 1, deliveries
    assert "nobody@mx.test" in deliveries.bounced_lines[0]
    # The bounce notice itself went to the sender through the same relay host.
    assert deliveries.sent == 1
    assert f"<{token}@test>" not in [message.message_id for message in mx.ledger]
