"""The proxy's ASGI app: `create_app(settings)` wires sessions, recorder and upstream to the routes."""

from __future__ import annotations

import asyncio
import hmac
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.routing import Route

from orchard.errors import AuthError, ForbiddenError, NotFoundError, OrchardError
from orchard.proxy import dialects
from orchard.proxy.pipeline import Pipeline, api_key, error_response
from orchard.proxy.recorder import SESSIONS, Durability, Recorder, load_call, read_records
from orchard.proxy.sessions import RewardBody, SessionOptions, Sessions
from orchard.proxy.stitching import samples, stitch


class ProxySettings(BaseModel):
    """How one proxy runs (every field is also a flag of `orchard proxy serve`)."""

    model_config = ConfigDict(extra="forbid")

    upstream_url: str
    """The OpenAI-compatible model server (``http://host:port`` or ``.../v1``)."""
    upstream_api_key: Optional[str] = None
    """The key the proxy sends upstream; it never leaves the proxy."""
    model: Optional[str] = None
    """Model name sent upstream when a session does not set one (default: the name the harness asks for)."""
    store_dir: str = "proxy-store"
    """Where calls and session events are recorded (append-only JSONL)."""
    durability: Durability = "fsync"
    """``fsync``: every call is on disk before the harness sees its reply; ``flush``: in the kernel (survives a proxy crash)."""
    admin_keys: list[str] = Field(default_factory=list)
    """Keys that may open, inspect, reward and close sessions."""
    no_auth: bool = False
    """Session management without a key (only allowed on a loopback address; harness calls always need their session key)."""
    upstream_timeout_s: float = 600.0
    """How long to wait for the upstream's reply before answering the harness with a timeout error."""
    public_url: Optional[str] = None
    """Base of the URLs handed out per session (default: the URL the admin used to reach the proxy)."""
    max_body_bytes: int = 32 * 1024 * 1024
    """Largest request body a harness may send."""
    stream_keepalive_s: float = Field(default=5.0, gt=0)
    """A streaming call whose upstream takes longer than this opens its stream and sends keep-alive comments this often."""


def create_app(settings: ProxySettings) -> FastAPI:
    """The proxy app: harness routes, session management, and the store reopened in its lifespan."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        from orchard.proxy.upstream import Upstream

        upstream = Upstream(settings.upstream_url, settings.upstream_api_key, settings.upstream_timeout_s)
        state = await asyncio.to_thread(_open_state, settings, upstream)
        app.state.proxy = state
        try:
            yield
        finally:
            await state.pipeline.upstream.aclose()
            state.recorder.close()

    app = _ProxyApp(title="Orchard harness proxy", lifespan=lifespan)
    app.add_exception_handler(OrchardError, _orchard_error)
    _admin_routes(app, settings)
    _harness_routes(app)
    return app


class _ProxyApp(FastAPI):
    """FastAPI, except that model calls (the hot path) skip its middleware stack and router: in a profile under load
    those layers took about a third of the proxy's CPU per call. The same routes stay registered below, so a path
    this shortcut does not match exactly (a trailing slash, a root path) still gets FastAPI's answer."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            target, state = _call_target(scope["path"]), getattr(self.state, "proxy", None)
            if target is not None and state is not None:
                await _serve_call(state.pipeline, target, scope, receive, send)
                return
        await super().__call__(scope, receive, send)


CALL_PATHS = {"/v1/chat/completions": dialects.openai_chat, "/chat/completions": dialects.openai_chat,
              "/v1/responses": dialects.openai_responses, "/responses": dialects.openai_responses,
              "/v1/messages": dialects.anthropic_messages}
"""The model-call paths of every dialect, each also served under ``/sessions/{id}``."""


def _call_target(path: str) -> Optional[tuple[Any, Optional[str]]]:
    """(dialect, session id from the path) for a model-call path, else None."""
    if path.startswith("/sessions/"):
        session_id, slash, rest = path[len("/sessions/"):].partition("/")
        dialect = CALL_PATHS.get("/" + rest) if session_id and slash else None
        return (dialect, session_id) if dialect is not None else None
    dialect = CALL_PATHS.get(path)
    return (dialect, None) if dialect is not None else None


async def _serve_call(pipeline: Pipeline, target: tuple[Any, Optional[str]], scope: Any, receive: Any, send: Any) -> None:
    dialect, session_id = target
    request = Request(scope, receive)
    try:
        response = await pipeline.handle(dialect, request, session_id)
    except OrchardError as e:  # as the app's exception handler would answer it
        response = await _orchard_error(request, e)
    await response(scope, receive, send)


class _State:
    def __init__(self, sessions: Sessions, recorder: Recorder, pipeline: Pipeline):
        self.sessions, self.recorder, self.pipeline = sessions, recorder, pipeline


def _open_state(settings: ProxySettings, upstream: Any) -> _State:
    """Reopen the store: sessions and their calls survive a restart."""
    recorder = Recorder(settings.store_dir, settings.durability)
    sessions = Sessions()
    sessions.replay(read_records(settings.store_dir, SESSIONS), recorder.load_index())
    return _State(sessions, recorder, Pipeline(sessions, recorder, upstream, settings.model, settings.max_body_bytes,
                                                     settings.stream_keepalive_s))


async def _orchard_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, OrchardError)
    return JSONResponse({"detail": error.detail, "error": type(error).__name__}, status_code=error.status_code)


def _admin_guard(settings: ProxySettings):
    async def check(request: Request) -> _State:
        if not settings.no_auth:
            key = api_key(request)
            if not key:
                raise AuthError("this endpoint needs the proxy's admin key")
            if not any(hmac.compare_digest(key, k) for k in settings.admin_keys):
                raise ForbiddenError("not an admin key")
        return request.app.state.proxy
    return check


def _base_urls(settings: ProxySettings, request: Request, session_id: str) -> dict[str, str]:
    base = (settings.public_url or str(request.base_url)).rstrip("/") + f"/sessions/{session_id}"
    return {"openai_chat": base + "/v1", "openai_responses": base + "/v1", "anthropic_messages": base}


def _admin_routes(app: FastAPI, settings: ProxySettings) -> None:
    from fastapi import Depends

    admin = Depends(_admin_guard(settings))

    @app.post("/sessions", status_code=201)
    async def create_session(request: Request, options: SessionOptions = SessionOptions(), state: _State = admin) -> dict[str, Any]:
        session, key = state.sessions.create(options)
        await state.recorder.append(SESSIONS, state.sessions.event(session, "created"))
        return {"id": session.id, "key": key, "status": session.status, "options": options.model_dump(),
                "base_urls": _base_urls(settings, request, session.id)}

    @app.get("/sessions")
    async def list_sessions(state: _State = admin) -> list[dict[str, Any]]:
        return [{"id": s.id, "status": s.status, "calls": len(s.calls), "reward": s.reward} for s in state.sessions.by_id.values()]

    @app.get("/sessions/{session_id}")
    async def get_session(session_id: str, state: _State = admin) -> dict[str, Any]:
        return state.sessions.get(session_id).view()

    @app.post("/sessions/{session_id}/reward")
    async def reward(session_id: str, body: RewardBody, state: _State = admin) -> dict[str, Any]:
        session = state.sessions.get(session_id)
        await state.recorder.append(SESSIONS, state.sessions.event(session, "reward", reward=body.reward, info=body.info))
        session.reward, session.reward_info = body.reward, body.info
        return session.view()

    @app.post("/sessions/{session_id}/close")
    async def close(session_id: str, state: _State = admin) -> dict[str, Any]:
        session = state.sessions.get(session_id)
        if session.status == "open":
            await state.recorder.append(SESSIONS, state.sessions.event(session, "status", status="closed", reason="closed by the caller"))
            session.status, session.reason = "closed", "closed by the caller"
        return session.view()

    @app.get("/sessions/{session_id}/calls")
    async def calls(session_id: str, state: _State = admin) -> list[dict[str, Any]]:
        state.sessions.get(session_id)
        records = await asyncio.to_thread(state.recorder.read_session_calls, session_id)
        return [load_call(r).model_dump() for r in records]

    @app.get("/sessions/{session_id}/trajectories")
    async def trajectories(session_id: str, state: _State = admin) -> dict[str, Any]:
        session = state.sessions.get(session_id)
        records = await asyncio.to_thread(state.recorder.read_session_calls, session_id)
        models = [load_call(r) for r in records]
        return {"trajectories": [t.model_dump() for t in stitch(models, session.reward)],
                "samples": [s.model_dump() for s in samples(models, session.reward)]}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}


def _harness_routes(app: FastAPI) -> None:
    """The model endpoints, under ``/v1`` (session found by key) and ``/sessions/{id}/v1`` (key must match)."""
    for prefix in ("", "/sessions/{session_id}"):
        for path, dialect in CALL_PATHS.items():
            app.router.routes.append(Route(prefix + path, _call_endpoint(dialect), methods=["POST"]))
        app.router.routes.append(Route(prefix + "/v1/messages/count_tokens", _count_tokens, methods=["POST"]))
        for path in ("/v1/models", "/models", "/v1/models/{model_id:path}", "/models/{model_id:path}"):
            app.router.routes.append(Route(prefix + path, _models, methods=["GET"]))
        app.router.routes.append(Route(prefix or "/", _reachable, methods=["HEAD"]))
    for prefix in ("", "/sessions/{session_id}"):
        app.router.routes.append(Route(prefix + "/v1/{rest:path}", _unknown, methods=["GET", "POST", "PUT", "DELETE", "PATCH"]))


async def _unknown(request: Request) -> Response:
    """Endpoints no harness needs answer 404 in the caller's dialect, so its SDK raises its own NotFound error."""
    dialect = dialects.anthropic_messages if "anthropic-version" in request.headers else dialects.openai_chat
    return error_response(dialect, NotFoundError(f"the proxy does not serve {request.method} {request.url.path}"))


async def _reachable(request: Request) -> Response:
    """Claude Code probes its base URL with HEAD before the first call."""
    return Response(status_code=200)


def _call_endpoint(dialect: Any):
    async def endpoint(request: Request):
        state: _State = request.app.state.proxy
        return await state.pipeline.handle(dialect, request, request.path_params.get("session_id"))
    return endpoint


async def _count_tokens(request: Request):
    """Claude Code asks this to budget its context; the answer is an estimate, never used for training."""
    state: _State = request.app.state.proxy
    dialect = dialects.anthropic_messages
    try:
        _, _, call = await state.pipeline.admit(dialect, request, request.path_params.get("session_id"),
                                                parse=dialect.parse_count_request)
    except OrchardError as e:
        return error_response(dialect, e)
    return JSONResponse({"input_tokens": dialect.count_tokens(call)})


async def _models(request: Request):
    """The upstream's models, in a shape both the OpenAI and the Anthropic SDKs read."""
    state: _State = request.app.state.proxy
    dialect = dialects.anthropic_messages if "anthropic-version" in request.headers else dialects.openai_chat
    try:
        session = state.sessions.authenticate(api_key(request), request.path_params.get("session_id"))
    except OrchardError as e:
        return error_response(dialect, e)
    names = [m["id"] for m in await state.pipeline.upstream.models()]
    for extra in (session.options.model, state.pipeline.model):
        if extra and extra not in names:
            names.insert(0, extra)
    data = [_model_entry(n) for n in names]
    wanted = request.path_params.get("model_id")
    if wanted:
        return JSONResponse(next((m for m in data if m["id"] == wanted), _model_entry(wanted)))
    return JSONResponse({"object": "list", "data": data, "has_more": False,
                         "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None})


def _model_entry(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "type": "model", "created": 0, "created_at": "1970-01-01T00:00:00Z",
            "owned_by": "orchard", "display_name": name}
