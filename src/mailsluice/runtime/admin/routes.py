"""The admin server's first routes: ``/metrics``, ``/healthz``, ``/readyz``.

``/metrics`` is the Prometheus text format of the registry it is given (the process's own,
or with several workers the sum of every process's, ``multiproc``), as ``Exposed`` shows
it: the same families whatever the number of workers; ``/healthz`` says the
server's loop answers (liveness); ``/readyz`` says whether the proxy serves: its
listeners bound and its workers up (200), or what is missing (503). The two probes need
no token (public routes: a probe should not hold a secret, and they tell nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from mailsluice.runtime.admin.http import Request, Response, Router

__all__ = ["Exposed", "Readiness", "add_routes"]

#: (ready, what to say)
Readiness = Callable[[], tuple[bool, str]]


class Exposed(Collector):
    """``registry`` as scraped: without ``*_created`` series and without empty families.

    ``prometheus_client`` adds a ``_created`` gauge (the creation time) to every counter
    and histogram of a process's own registry, and none in multi-process mode, where
    there is no one creation time to sum; and it shows a labelled metric with no child
    yet as a family with no sample in a process's registry, but not at all from the
    multi-process files. Dropped here, at the exposition, so that one process and ``N``
    workers expose the same families, without ``disable_created_metrics()``, which
    would change the library for the whole process. (``_created`` is also of no use to
    ``rate()``, and doubles the series Prometheus keeps.)"""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            samples = [s for s in family.samples if not s.name.endswith("_created")]
            if not samples:
                continue
            shown = Metric(family.name, family.documentation, family.type, family.unit)
            shown.samples = samples
            yield shown


def add_routes(
    router: Router,
    registry: CollectorRegistry,
    ready: Readiness,
    before_scrape: Callable[[], None] | None = None,
) -> Router:
    """Add the routes to ``router``; ``before_scrape`` brings sampled values up to date."""
    exposed = Exposed(registry)

    async def metrics(request: Request) -> Response:
        if before_scrape is not None:
            before_scrape()
        return Response(200, generate_latest(exposed), CONTENT_TYPE_LATEST)

    async def healthz(request: Request) -> Response:
        return Response.text(200, "ok\n")

    async def readyz(request: Request) -> Response:
        ok, text = ready()
        return Response.text(200 if ok else 503, text + "\n")

    router.add("GET", "/metrics", metrics)
    router.add("GET", "/healthz", healthz, public=True)
    router.add("GET", "/readyz", readyz, public=True)
    return router
