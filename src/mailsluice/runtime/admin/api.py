"""The admin JSON API (``/api/...``), documented in ``docs/admin-api.yaml``.

Everything here is behind the bearer token (``http.AdminServer``). What it reads and acts
on comes in an ``ApiContext``: the live sessions (this process's registry, or with
``--workers N`` the workers' published snapshots, ``live``), the scheduler (fair
sharing: destinations and tenants), the suspensions (``runtime.suspensions``), the
metrics registry (the overview's counters, summed over the processes), the session log
(recent sessions and transcripts), and what drains.

Errors are JSON too: ``{"error": "...what is wrong and what to do..."}``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from mailsluice.runtime.admin.collect import SchedulerView
from mailsluice.runtime.admin.history import History
from mailsluice.runtime.admin.http import Request, Response, Router
from mailsluice.runtime.admin.live import valid_session_id
from mailsluice.runtime.suspensions import SuspensionError, Suspensions, Targets

__all__ = ["ApiContext", "add_api"]

RECENT_LIMIT = 200


@dataclass
class ApiContext:
    """What the API reads and acts on (see the module docstring)."""

    suspensions: Suspensions
    registry: CollectorRegistry
    sessions: Callable[[], list[dict[str, object]]]
    abort: Callable[[str], Awaitable[bool]]
    scheduler: SchedulerView | None = None
    drain: Callable[[], str] | None = None
    draining: Callable[[], bool] = lambda: False  # not accepting new sessions any more
    reload: Callable[[], Awaitable[tuple[int, dict[str, object]]]] | None = None
    # a live session of this process and its lines not yet in the log (``live``)
    held: Callable[[str], tuple[dict[str, object], list[dict[str, object]]] | None] | None = None
    log_url: str | None = None
    weights: dict[str, float] = field(default_factory=dict)  # [[tenants]] groups
    targets: Targets | None = None  # what a suspension may name (None: anything)
    workers: int = 1
    started: float = field(default_factory=time.time)
    history: History | None = None  # the last 15 minutes' totals (``history``)


def json_response(status: int, value: object) -> Response:
    body = json.dumps(value, indent=1, default=str).encode() + b"\n"
    return Response(status, body, "application/json")


def _error(status: int, text: str) -> Response:
    return json_response(status, {"error": text})


def _counter_totals(registry: CollectorRegistry) -> dict[str, dict[str, float]]:
    """``mailsluice_transactions`` by outcome, MX and proxy deferrals by class/reason."""
    wanted = {
        "mailsluice_transactions": "outcome",
        "mailsluice_mx_deferrals": "class",
        "mailsluice_proxy_deferrals": "reason",
    }
    out: dict[str, dict[str, float]] = {name: {} for name in wanted}
    for family in registry.collect():
        label = wanted.get(family.name)
        if label is None:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                key = sample.labels.get(label, "")
                into = out[family.name]
                into[key] = into.get(key, 0.0) + sample.value
    return out


def chart_totals(registry: CollectorRegistry) -> tuple[float, float]:
    """What the dashboard's chart draws, cumulative: messages delivered, and deferrals
    (the transactions deferred, by the MX or by us, and every 4xx of an MX)."""
    totals = _counter_totals(registry)
    outcomes = totals["mailsluice_transactions"]
    deferred = sum(v for k, v in outcomes.items() if k.startswith("deferred"))
    return outcomes.get("delivered", 0.0), deferred + sum(
        totals["mailsluice_mx_deferrals"].values()
    )


def add_api(router: Router, ctx: ApiContext) -> Router:
    """Add the JSON API's routes to ``router``."""

    async def overview(request: Request) -> Response:
        totals = _counter_totals(ctx.registry)
        outcomes = totals["mailsluice_transactions"]
        sessions = ctx.sessions()
        return json_response(200, {
            "now": time.time(),
            "uptime_s": round(time.time() - ctx.started, 1),
            "workers": ctx.workers,
            "fair_sharing": ctx.scheduler is not None,
            "draining": ctx.draining(),
            "sessions_in_flight": len(sessions),
            "transactions": outcomes,
            "delivered": outcomes.get("delivered", 0.0),
            "deferred": sum(v for k, v in outcomes.items() if k.startswith("deferred")),
            "mx_deferrals": totals["mailsluice_mx_deferrals"],
            "proxy_deferrals": totals["mailsluice_proxy_deferrals"],
            "suspensions": len(ctx.suspensions.active()),
        })  # fmt: skip

    async def sessions(request: Request) -> Response:
        return json_response(200, {"sessions": ctx.sessions()})

    async def history(request: Request) -> Response:
        if ctx.history is None:
            return json_response(200, {"step_s": 0, "span_s": 0, "samples": []})
        return json_response(200, ctx.history.as_json())

    async def abort(request: Request) -> Response:
        ident = request.params.get("id", "")
        if not valid_session_id(ident):
            return _error(400, f"{ident!r} is not a session id (mailsluice ctl sessions "
                          "lists them)")  # fmt: skip
        if not await ctx.abort(ident):
            return _error(404, f"no live session {ident} (it may have ended; mailsluice "
                          "ctl sessions lists those open)")  # fmt: skip
        return json_response(200, {"aborted": ident})

    async def transcript(request: Request) -> Response:
        """From the session log, and for a live session of this process the lines its
        relay still holds (handed to the log at the transaction's end, every 64 lines)."""
        ident = request.params.get("id", "")
        held = ctx.held(ident) if ctx.held is not None else None
        if ctx.log_url is None and held is None:
            return _error(404, "no session log is configured (log = ...)")
        from mailsluice.sessionlog import SessionLogError, session_with_transcript

        session: dict[str, object]
        lines: list[dict[str, object]] = []
        try:
            if ctx.log_url is None:
                raise SessionLogError("no session log")
            session, lines = await asyncio.to_thread(session_with_transcript, ctx.log_url, ident)
        except SessionLogError as exc:
            if held is None:
                return _error(404, f"{exc}")
            session = held[0]
        if held is not None:
            last = max((int(str(line.get("seq", 0))) for line in lines), default=0)
            lines = lines + [line for line in held[1] if int(str(line["seq"])) > last]
        return json_response(200, {"session": session, "lines": lines})

    async def recent(request: Request) -> Response:
        if ctx.log_url is None:
            return json_response(200, {"sessions": []})
        from mailsluice.sessionlog import SessionLogError, list_sessions

        try:
            rows = await asyncio.to_thread(list_sessions, ctx.log_url, 30)
        except SessionLogError as exc:
            return _error(503, f"the session log cannot be read: {exc}")
        return json_response(200, {"sessions": rows[:RECENT_LIMIT]})

    async def destinations(request: Request) -> Response:
        views = ctx.scheduler.views() if ctx.scheduler is not None else []
        suspended = {s.name: s.as_json(time.time()) for s in ctx.suspensions.active()
                     if s.kind == "destination"}  # fmt: skip
        return json_response(200, {"fair_sharing": ctx.scheduler is not None,
                                   "destinations": views, "suspended": suspended})  # fmt: skip

    async def tenants(request: Request) -> Response:
        now = time.time()
        table: dict[str, dict[str, Any]] = {}

        def row(name: str) -> dict[str, Any]:
            return table.setdefault(name, {
                "tenant": name, "weight": ctx.weights.get(name, 1.0), "sessions": 0,
                "busy": 0, "idle": 0, "waiting": 0, "granted": 0, "waited": 0,
                "wait_s": 0.0, "suspended": None,
            })  # fmt: skip

        for name in ctx.weights:
            row(name)
        for session in ctx.sessions():
            row(str(session.get("tenant")))["sessions"] += 1
        if ctx.scheduler is not None:
            for view in ctx.scheduler.views():
                for name, numbers in _dict(view.get("tenants")).items():
                    into = row(name)
                    for key in ("busy", "idle", "waiting"):
                        into[key] += int(numbers.get(key, 0))
            for name, (granted, waited, seconds) in ctx.scheduler.waits.by_tenant.items():
                into = row(name.rpartition("@")[0] or name)
                into["granted"] += granted
                into["waited"] += waited
                into["wait_s"] = round(into["wait_s"] + seconds, 3)
        for suspension in ctx.suspensions.active():
            if suspension.kind == "tenant":
                row(suspension.name)["suspended"] = suspension.as_json(now)
        return json_response(200, {"tenants": sorted(table.values(), key=lambda r: r["tenant"])})

    async def list_suspensions(request: Request) -> Response:
        now = time.time()
        rows = [s.as_json(now) for s in ctx.suspensions.active()]
        return json_response(200, {"suspensions": rows})

    async def suspend(request: Request) -> Response:
        try:
            body = json.loads(request.body or b"{}")
        except ValueError:
            return _error(400, 'the body must be JSON: {"kind": ..., "name": ..., "seconds": N}')
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object")
        try:
            # (on the loop: a small file, and the suspensions are read on the loop too)
            made = ctx.suspensions.add(
                body.get("kind"), body.get("name"), body.get("seconds"), body.get("reason", ""),
                ctx.targets,
            )  # fmt: skip
        except SuspensionError as exc:
            return _error(400, str(exc))
        except OSError as exc:
            return _error(500, f"cannot keep the suspension in the state directory: {exc}")
        return json_response(201, made.as_json(time.time()))

    async def resume(request: Request) -> Response:
        ident = request.params.get("id", "")
        try:
            ended = ctx.suspensions.remove(ident)
        except OSError as exc:
            return _error(500, f"cannot write the suspensions file: {exc}")
        if ended is None:
            return _error(404, f"no suspension {ident} (mailsluice ctl suspensions lists "
                          "them)")  # fmt: skip
        return json_response(200, {"resumed": ended.as_json(time.time())})

    async def drain(request: Request) -> Response:
        if ctx.drain is None:
            return _error(501, "drain is not available here")
        return json_response(202, {"draining": ctx.drain()})

    async def reload(request: Request) -> Response:
        if ctx.reload is None:
            return _error(
                501,
                "this proxy was started without a configuration file (--config): there is "
                "nothing to read again; restart it with the new settings",
            )
        status, body = await ctx.reload()
        return json_response(status, body)

    router.add("GET", "/api/overview", overview)
    router.add("GET", "/api/sessions", sessions)
    router.add("GET", "/api/history", history)
    router.add("POST", "/api/sessions/{id}/abort", abort)
    router.add("GET", "/api/sessions/{id}/transcript", transcript)
    router.add("GET", "/api/recent", recent)
    router.add("GET", "/api/destinations", destinations)
    router.add("GET", "/api/tenants", tenants)
    router.add("GET", "/api/suspensions", list_suspensions)
    router.add("POST", "/api/suspensions", suspend)
    router.add("DELETE", "/api/suspensions/{id}", resume)
    router.add("POST", "/api/drain", drain)
    router.add("POST", "/api/reload", reload)
    return router


def _dict(value: object) -> dict[str, dict[str, int]]:
    return value if isinstance(value, dict) else {}
