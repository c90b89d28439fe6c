"""The live dashboard: one page and its script, shipped in the package (no CDN, no build).

``static/dashboard.html`` and ``static/dashboard.js`` are package data (in the wheel),
served as they are at ``/`` and ``/dashboard.js`` with no token: they hold no data. The
page asks for the token once, keeps it in the tab's ``sessionStorage`` (never in the
URL, gone when the tab closes) and sends it as ``Authorization: Bearer`` with every call
of the JSON API (``api``), polled every second. The page's Content-Security-Policy allows
its own script and nothing else (no inline script, no other origin).
"""

from __future__ import annotations

from importlib import resources

from mailsluice.runtime.admin.http import Request, Response, Router

__all__ = ["add_dashboard"]

_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'none'"
)


def _asset(name: str) -> bytes:
    return resources.files("mailsluice.runtime.admin").joinpath("static", name).read_bytes()


def add_dashboard(router: Router) -> Router:
    """``GET /`` (the page) and ``GET /dashboard.js``, public."""
    page = _asset("dashboard.html")
    script = _asset("dashboard.js")
    headers = (("content-security-policy", _CSP), ("x-content-type-options", "nosniff"))

    async def index(request: Request) -> Response:
        return Response(200, page, "text/html; charset=utf-8", headers)

    async def javascript(request: Request) -> Response:
        return Response(200, script, "text/javascript; charset=utf-8", headers)

    router.add("GET", "/", index, public=True)
    router.add("GET", "/dashboard.js", javascript, public=True)
    return router
