"""The admin server's first routes: ``/metrics``, ``/healthz``, ``/readyz``.

``/metrics`` is the Prometheus text format of the registry it is given (the process's own,
or with several workers the sum of every process's, ``multiproc``); ``/healthz`` says the
server's loop answers (liveness); ``/readyz`` says whether the proxy serves: its
listeners bound and its workers up (200), or what is missing (503). The two probes need
no token (public routes: a probe should not hold a secret, and they tell nothing).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from mailsluice.runtime.admin.http import Request, Response, Router

__all__ = ["Readiness", "add_routes"]

#: (ready, what to say)
Readiness = Callable[[], tuple[bool, str]]


def add_routes(
    router: Router,
    registry: CollectorRegistry,
    ready: Readiness,
    before_scrape: Callable[[], None] | None = None,
) -> Router:
    """Add the routes to ``router``; ``before_scrape`` brings sampled values up to date."""

    async def metrics(request: Request) -> Response:
        if before_scrape is not None:
            before_scrape()
        return Response(200, generate_latest(registry), CONTENT_TYPE_LATEST)

    async def healthz(request: Request) -> Response:
        return Response.text(200, "ok\n")

    async def readyz(request: Request) -> Response:
        ok, text = ready()
        return Response.text(200 if ok else 503, text + "\n")

    router.add("GET", "/metrics", metrics)
    router.add("GET", "/healthz", healthz, public=True)
    router.add("GET", "/readyz", readyz, public=True)
    return router
