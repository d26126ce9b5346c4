"""One harness call, start to end: authenticate, translate, check limits, forward, record durably, render."""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import nullcontext
from types import ModuleType
from typing import Any, AsyncIterator, Callable, Optional

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from orchard.errors import (OrchardError, PayloadTooLargeError, RequestError, ServerError, SessionLimitError, UpstreamError,
                            UpstreamNoTokensError)
from orchard.proxy import fastjson
from orchard.proxy.dialects.base import ChatCall
from orchard.proxy.recorder import CALLS, SESSIONS, Recorder
from orchard.proxy.sessions import Session, Sessions
from orchard.proxy.upstream import Upstream, UpstreamResult

JSON = "application/json"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def api_key(request: Request) -> Optional[str]:
    """The key a harness sent: ``Authorization: Bearer``, ``x-api-key`` (Anthropic) or ``api-key`` (Azure style)."""
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return request.headers.get("x-api-key") or request.headers.get("api-key")


def error_response(dialect: ModuleType, error: OrchardError) -> Response:
    """An error in the dialect's own shape; a limit carries a code so harness logs say why they stopped."""
    code = "session_limit_reached" if isinstance(error, SessionLimitError) else None
    if isinstance(error, UpstreamError) and not isinstance(error, UpstreamNoTokensError):
        code = "upstream_error"
    body = dialect.error_body(error.status_code, error.detail, code)
    return Response(json.dumps(body).encode(), status_code=error.status_code, media_type=JSON)


class Pipeline:
    """Everything a call needs, shared by every route of every dialect."""

    def __init__(self, sessions: Sessions, recorder: Recorder, upstream: Upstream, model: Optional[str],
                 max_body_bytes: int, keepalive_s: float = 5.0):
        self.sessions, self.recorder, self.upstream = sessions, recorder, upstream
        self.model, self.max_body_bytes, self.keepalive_s = model, max_body_bytes, keepalive_s

    async def admit(self, dialect: ModuleType, request: Request, path_session: Optional[str],
                    parse: Optional[Callable[[Any], ChatCall]] = None) -> tuple[Session, Any, ChatCall]:
        """Who is calling and what they ask, checked; raises OrchardError for the dialect to render."""
        session = self.sessions.authenticate(api_key(request), path_session)
        body = await self._json(request)
        return session, body, (parse or dialect.parse_request)(body)

    async def _json(self, request: Request) -> Any:
        if int(request.headers.get("content-length") or 0) > self.max_body_bytes:
            raise PayloadTooLargeError(f"request body over {self.max_body_bytes} bytes")
        raw = await request.body()
        if len(raw) > self.max_body_bytes:
            raise PayloadTooLargeError(f"request body over {self.max_body_bytes} bytes")
        try:
            body, strict = fastjson.parse(raw)
        except ValueError as e:
            raise RequestError(f"the request body is not valid JSON: {e}") from e
        request.state.raw_body, request.state.strict_json = raw, strict
        return body

    async def handle(self, dialect: ModuleType, request: Request, path_session: Optional[str]) -> Response:
        """Route entry point for every model call of every dialect."""
        started = time.time()
        try:
            session, _, call = await self.admit(dialect, request, path_session)
        except OrchardError as e:
            return error_response(dialect, e)
        try:
            index, budget = self._take_slot(session)
        except OrchardError as e:
            await self._note_limit(session)
            return error_response(dialect, e)
        reply = self.forward(dialect, session, request.state.raw_body, call, index, budget, started,
                             request.state.strict_json)
        if not call.stream:
            return await reply
        work = asyncio.ensure_future(reply)
        await asyncio.wait({work}, timeout=self.keepalive_s)
        if work.done():
            return work.result()
        return StreamingResponse(_keepalive(dialect, work, self.keepalive_s), media_type="text/event-stream",
                                 headers=SSE_HEADERS)

    def _take_slot(self, session: Session) -> tuple[int, Optional[int]]:
        if session.status == "refused":
            raise UpstreamNoTokensError(f"session {session.id} was refused: {session.reason}")
        return session.admit()

    async def _note_limit(self, session: Session) -> None:
        """The first refusal past a limit is kept with the session (later ones find it already over)."""
        if session.status == "limit_reached" and not session.limit_recorded:
            session.limit_recorded = True
            await self.recorder.append(SESSIONS, self.sessions.event(session, "status", status=session.status,
                                                                     reason=session.reason))

    async def forward(self, dialect: ModuleType, session: Session, request_bytes: bytes, call: ChatCall, index: int,
                      budget: Optional[int], started: float, strict: bool = True) -> Response:
        """Ask upstream, record the outcome durably, then answer the harness.

        ``strict``: the request was strict JSON, so nothing taken from it is NaN or infinite (see fastjson.dumps)."""
        upstream_body = call.upstream_body(session.options.model or self.model)
        if budget is not None:
            upstream_body["max_tokens"] = min(upstream_body.get("max_tokens") or budget, budget)
        payload = fastjson.dumps(upstream_body, strict)
        record = {"session_id": session.id, "index": index, "dialect": dialect.NAME, "text_only": session.options.text_only}
        raw = {"request": request_bytes, "upstream_request": payload}
        try:
            result = await self.upstream.complete(payload, call.model or upstream_body["model"], session.options.text_only)
        except (UpstreamError, RequestError) as e:
            return await self._answer_failure(dialect, session, record, raw, e, started)
        try:
            await self._record_success(session, record, raw, result, call, started)
        except OSError as e:  # the reply is withheld: a harness must never get an answer that was not recorded
            return error_response(dialect, ServerError(f"the proxy could not record the call: {e}"))
        return self.render(dialect, result, call, strict)

    async def _answer_failure(self, dialect: ModuleType, session: Session, record: dict[str, Any], raw: dict[str, bytes],
                              error: OrchardError, started: float) -> Response:
        try:
            await self._record_failure(session, record, raw, error, started)
        except OSError as e:
            error = ServerError(f"{error.detail}; and the proxy could not record the failure: {e}")
        return error_response(dialect, error)

    async def _record_failure(self, session: Session, record: dict[str, Any], raw: dict[str, bytes], error: OrchardError,
                              started: float) -> None:
        record |= {"status": "error", "error": f"{type(error).__name__}: {error.detail}",
                   "infra_failure": isinstance(error, UpstreamError), "timings": _timings(started, 0.0)}
        if isinstance(error, UpstreamNoTokensError) and session.status == "open":
            session.status, session.reason = "refused", "the upstream returns no token ids and the session is not text-only"
            await self.recorder.append(SESSIONS, self.sessions.event(session, "status", status=session.status,
                                                                     reason=session.reason))
        await self.recorder.append(CALLS, record, session.id, raw)
        session.note_call(record, 0, 0)

    async def _record_success(self, session: Session, record: dict[str, Any], raw: dict[str, bytes], result: UpstreamResult,
                              call: ChatCall, started: float) -> None:
        # The prompt ids (often 10^4-10^5 of them) are stored once, inside the raw reply: see recorder.load_call.
        record |= {"completion_token_ids": result.completion_token_ids, "logprobs": result.logprobs,
                   "text_only": not result.completion_token_ids, "finish_reason": result.completion.finish_reason,
                   "status": "ok", "error": None, "infra_failure": False, "timings": _timings(started, result.seconds)}
        if call.notes:
            record["notes"] = call.notes
        await self.recorder.append(CALLS, record, session.id, raw | {"reply": result.raw})
        session.note_call(record, result.completion.prompt_tokens, result.completion.completion_tokens)

    @staticmethod
    def render(dialect: ModuleType, result: UpstreamResult, call: ChatCall, strict: bool = True) -> Response:
        """The harness's reply; ``strict=False`` (the request was not strict JSON) renders with the standard library."""
        with nullcontext() if strict else fastjson.lenient():
            if call.stream:
                return Response(dialect.render_stream(result.completion, call), media_type="text/event-stream",
                                headers=SSE_HEADERS)
            return Response(fastjson.dumps(dialect.render_reply(result.completion, call)), media_type=JSON)


async def _keepalive(dialect: ModuleType, work: "asyncio.Future[Response]", interval: float) -> AsyncIterator[bytes]:
    """A slow upstream: the stream opens now and carries SSE comments (which every client skips) until the reply is in;
    an error that comes after the 200 went out travels as the dialect's in-stream error event."""
    while True:
        yield b": keepalive\n\n"
        await asyncio.wait({work}, timeout=interval)
        if work.done():
            break
    response = work.result()
    body = bytes(response.body)
    yield body if response.status_code == 200 else dialect.render_stream_error(json.loads(body))


def _timings(started: float, upstream_s: float) -> dict[str, float]:
    return {"started_at": started, "upstream_s": upstream_s, "total_s": time.time() - started}

