"""Build the ASGI app from settings: routes, auth, typed errors, request ids, body limits, lifespan."""

from __future__ import annotations

import gc
import json
import logging
import uuid
from contextlib import asynccontextmanager
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from orchard import __version__, errors
from orchard.env.backends.base import Backend
from orchard.env.server import pty, routes
from orchard.env.service.core import EnvCore
from orchard.env.service.stores import SqliteStore
from orchard.env.service.stores.base import Store
from orchard.env.settings import Settings

log = logging.getLogger("orchard.env")


def make_backend(settings: Settings) -> Backend:
    """The backend named by settings."""
    if settings.backend == "kubernetes":
        from orchard.env.backends.kubernetes import KubernetesBackend
        return KubernetesBackend(settings)
    if settings.backend == "container":
        from orchard.env.backends.container import ContainerBackend
        return ContainerBackend(settings)
    from orchard.env.backends.local import LocalBackend
    return LocalBackend(settings)


def make_store(settings: Settings) -> Store:
    """The store named by settings: embedded SQLite, or Redis shared by several replicas."""
    if settings.store == "redis":
        from orchard.env.service.stores.redis import RedisStore
        return RedisStore(settings.redis_url, prefix=settings.redis_prefix, job_ttl=settings.job_retention_seconds)
    return SqliteStore(settings.sqlite_path())


def create_app(settings: Optional[Settings] = None, backend: Optional[Backend] = None,
               store: Optional[Store] = None) -> FastAPI:
    """The Orchard Env ASGI app; long-lived resources live in its lifespan."""
    settings = settings or Settings()
    core = EnvCore(settings, backend or make_backend(settings), store or make_store(settings))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await core.start()
        gc.freeze()                       # start-up objects never need collecting again
        gc.set_threshold(50_000, 50, 100)  # rare young passes, full collections rarer still: no long pauses under load
        try:
            yield
        finally:
            await core.stop()

    app = FastAPI(title="Orchard Env", version=__version__, lifespan=lifespan)
    app.state.core = core
    app.include_router(routes.public)
    app.include_router(routes.router)
    app.include_router(pty.router)
    _install_errors(app)
    app.add_middleware(RequestLimits, max_body=settings.max_body_bytes)
    return app


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        detail = [{k: v for k, v in err.items() if k in ("type", "loc", "msg")} for err in exc.errors()]
        body = json.dumps({"detail": detail, "error": "RequestError"}, ensure_ascii=True, default=repr)
        return Response(body, 422, media_type="application/json")     # never echoes input that cannot encode

    @app.exception_handler(errors.OrchardError)
    async def orchard_error(request: Request, exc: errors.OrchardError) -> JSONResponse:
        headers = {"Retry-After": str(int(exc.retry_after or 1))} if exc.status_code == 503 else None
        return JSONResponse({"detail": exc.detail, "error": type(exc).__name__}, exc.status_code, headers=headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        rid = request.headers.get("x-request-id", "")
        log.exception("unhandled error (request %s)", rid)
        return JSONResponse({"detail": f"Internal server error (request {rid})", "error": "ServerError"}, 500)


class RequestLimits:
    """Pure ASGI middleware: echo or mint X-Request-ID, and refuse bodies over the limit with 413."""

    def __init__(self, app, max_body: int):
        self.app, self.max_body = app, max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rid = _header(scope, b"x-request-id") or uuid.uuid4().hex.encode()
        declared = _header(scope, b"content-length")
        if declared and declared.isdigit() and int(declared) > self.max_body:
            return await _too_large(send, rid, self.max_body)
        state = {"seen": 0, "too_big": False, "started": False}

        async def limited_receive():
            message = await receive()
            state["seen"] += len(message.get("body", b""))
            if state["seen"] > self.max_body:          # a chunked body past the limit: the app sees a disconnect
                state["too_big"] = True
                return {"type": "http.disconnect"}
            return message

        async def send_with_id(message):
            if state["too_big"]:
                return
            if message["type"] == "http.response.start":
                state["started"] = True
                message["headers"] = list(message.get("headers", [])) + [(b"x-request-id", rid)]
            await send(message)

        try:
            await self.app(scope, limited_receive, send_with_id)
        except Exception:
            if not state["too_big"]:
                raise
        if state["too_big"] and not state["started"]:
            await _too_large(send, rid, self.max_body)


def _header(scope, name: bytes) -> Optional[bytes]:
    for key, value in scope.get("headers", []):
        if key == name:
            return value[:200]
    return None


async def _too_large(send, rid: bytes, limit: int) -> None:
    body = f'{{"detail": "Request body exceeds {limit} bytes", "error": "PayloadTooLargeError"}}'.encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"x-request-id", rid),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
