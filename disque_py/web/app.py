"""The admin port's ASGI app (starlette): health, readiness, metrics, the JSON API, the page.

Routes (docs/OBSERVABILITY.md; the API is described in ``openapi.json``, served at
``/api/openapi.json``):

* ``GET /healthz`` (no auth), ``GET /readyz``, ``GET /metrics``;
* ``GET /api/cluster``, ``GET /api/queues``, ``GET /api/queues/{name}``,
  ``POST /api/queues/{name}/pause``, ``GET /api/jobs/{id}``,
  ``POST /api/jobs/{id}/ack|nack|dequeue``, ``GET /api/dead``, ``GET /api/dead/{name}``,
  ``POST /api/dead/{name}/requeue|purge``, ``GET /api/workers``, ``GET /api/groups``,
  ``GET /api/consumers``, ``POST /api/nodes/{id}/drain``
  (:mod:`.api`);
* ``GET /`` serves ``static/index.html`` when the page is installed, ``/static/*`` its
  files.

Every route but ``/healthz`` authenticates the caller (:mod:`.access`) first. Errors
are ``{"error": "..."}`` with a 4xx/5xx status.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any, Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from . import api
from .access import Caller, authenticate, may_read
from .handle import NodeHandle
from .metrics import make_registry

__all__ = ["make_app", "STATIC_DIR", "OPENAPI_PATH"]

HERE = Path(__file__).resolve().parent
STATIC_DIR = HERE / "static"
OPENAPI_PATH = HERE / "openapi.json"


def error(status: int, text: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": text}, status_code=status, headers=headers)


#: The page's own policy is in its <meta> tag; framing can only be refused by a header.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
UNAUTHORIZED_HEADERS = {"WWW-Authenticate": 'Basic realm="disque-py", charset="UTF-8"'}

View = Callable[[Request, NodeHandle, Caller], Awaitable[Response]]


def _guarded(handle: NodeHandle, view: View, *, read: bool = True) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        caller = authenticate(handle.acl, request.headers.get("authorization"))
        if caller is None:
            return error(401, "authentication required", UNAUTHORIZED_HEADERS)
        if read and not may_read(caller.user):
            return error(403, "this user has no permissions to read the node (@inspect)")
        try:
            return await view(request, handle, caller)
        except api.ApiError as exc:
            return error(exc.status, exc.text)

    return endpoint


async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok")


async def readyz(request: Request, handle: NodeHandle, caller: Caller) -> Response:
    ready, reason = api.readiness(handle)
    if ready:
        return JSONResponse({"ready": True})
    return JSONResponse({"ready": False, "reason": reason}, status_code=503)


def make_app(handle: NodeHandle) -> Starlette:
    registry = make_registry(handle)
    openapi_text = OPENAPI_PATH.read_text(encoding="utf-8") if OPENAPI_PATH.exists() else "{}"

    async def metrics(request: Request, handle: NodeHandle, caller: Caller) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def openapi(request: Request, handle: NodeHandle, caller: Caller) -> Response:
        return Response(openapi_text, media_type="application/json")

    async def index(request: Request) -> Response:
        page = STATIC_DIR / "index.html"
        if not page.is_file():
            return error(404, "the web page is not installed; see /api/openapi.json for the API")
        caller = authenticate(handle.acl, request.headers.get("authorization"))
        if caller is None:
            return error(401, "authentication required", UNAUTHORIZED_HEADERS)
        return FileResponse(page, media_type="text/html", headers=PAGE_HEADERS)

    g = partial(_guarded, handle)
    routes = [
        Route("/healthz", healthz, methods=["GET", "HEAD"]),
        Route("/readyz", g(readyz, read=False), methods=["GET", "HEAD"]),
        Route("/metrics", g(metrics), methods=["GET"]),
        Route("/api/openapi.json", g(openapi, read=False), methods=["GET"]),
        Route("/api/cluster", g(api.cluster), methods=["GET"]),
        Route("/api/queues", g(api.queues), methods=["GET"]),
        Route("/api/queues/{name:path}/pause", g(api.pause, read=False), methods=["POST"]),
        Route("/api/queues/{name:path}", g(api.queue), methods=["GET"]),
        Route("/api/jobs/{rest:path}", g(api.job_get), methods=["GET"]),
        Route("/api/dead", g(api.dead_queues), methods=["GET"]),
        Route("/api/workers", g(api.workers), methods=["GET"]),
        Route("/api/groups", g(api.groups), methods=["GET"]),
        Route("/api/consumers", g(api.consumers), methods=["GET"]),
        Route("/api/nodes/{id}/drain", g(api.drain_node, read=False), methods=["POST"]),
        Route("/api/dead/{name:path}/requeue", g(api.dead_action, read=False), methods=["POST"]),
        Route("/api/dead/{name:path}/purge", g(api.dead_action, read=False), methods=["POST"]),
        Route("/api/dead/{name:path}", g(api.dead_queue), methods=["GET"]),
        Route("/api/jobs/{rest:path}", g(api.job_action, read=False), methods=["POST"]),
        Route("/", index, methods=["GET", "HEAD"]),
    ]
    if STATIC_DIR.is_dir():
        routes.append(Mount("/static", app=StaticFiles(directory=str(STATIC_DIR)), name="static"))

    async def not_found(request: Request, exc: Exception) -> Response:
        return error(404, "not found")

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return error(405, "method not allowed")

    async def server_error(request: Request, exc: Exception) -> Response:
        return error(500, "internal error, check the server logs")

    app = Starlette(
        routes=routes,
        exception_handlers={404: not_found, 405: not_allowed, 500: server_error},
    )
    app.state.handle = handle
    return app


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))
