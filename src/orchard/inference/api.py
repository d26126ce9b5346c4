"""The OpenAI-compatible HTTP layer every model server shares: wire models, the engine protocol, `create_app(engine)`.

Replies are ``chat.completion`` objects plus the fields vLLM adds with ``return_token_ids``: top-level
``prompt_token_ids`` and per choice ``token_ids``, with ``logprobs.content`` aligned 1:1 with ``token_ids``.
Errors use OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Literal, Optional, Protocol, Union

from typing_extensions import TypedDict

from pydantic import BaseModel, ConfigDict, Field

from orchard.errors import OrchardError, RequestError
from orchard.inference import hermes
from orchard.inference.chat import ChatTokenizer

FinishReason = Literal["stop", "length", "tool_calls"]


# -- request --------------------------------------------------------------------------------------

class FunctionCall(BaseModel):
    name: str = Field(description="The function to call.")
    arguments: str = Field(description="Its arguments, a JSON object as a string.")


class ToolCall(BaseModel):
    id: str = Field(description="The call's id; a tool message answers it by tool_call_id.")
    type: Literal["function"] = Field("function", description="Always function.")
    function: FunctionCall = Field(description="What is called, with which arguments.")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"] = Field(description="Who speaks.")
    content: Union[str, list[dict[str, Any]], None] = Field(None, description="Text, or a list of text parts.")
    tool_calls: Optional[list[ToolCall]] = Field(None, description="Calls an assistant made.")
    tool_call_id: Optional[str] = Field(None, description="The call a tool message answers.")
    name: Optional[str] = Field(None, description="Optional speaker name.")


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(description="The function's name.")
    description: Optional[str] = Field(None, description="What it does, for the model.")
    parameters: Optional[dict[str, Any]] = Field(None, description="JSON Schema of its arguments.")


class Tool(BaseModel):
    type: Literal["function"] = Field(description="Always function.")
    function: FunctionSpec = Field(description="The function offered to the model.")


class ChatRequest(BaseModel):
    """``POST /v1/chat/completions``; fields OpenAI defines that no engine here uses are accepted and ignored."""

    model_config = ConfigDict(extra="allow")
    model: str = Field("", description="Model name (any name is accepted; the server serves one model).")
    messages: list[ChatMessage] = Field(min_length=1, description="The conversation so far.")
    tools: Optional[list[Tool]] = Field(None, description="Functions the model may call.")
    tool_choice: Union[Literal["none", "auto", "required"], dict[str, Any], None] = Field(
        None, description="none: tools are neither shown nor parsed; anything else: shown and parsed.")
    max_tokens: Optional[int] = Field(None, ge=1, description="Most completion tokens (default: the engine's).")
    max_completion_tokens: Optional[int] = Field(None, ge=1, description="Newer name for max_tokens.")
    temperature: Optional[float] = Field(None, ge=0, le=2, description="0 is greedy; default 1.")
    top_p: Optional[float] = Field(None, gt=0, le=1, description="Nucleus sampling mass; default 1.")
    seed: Optional[int] = Field(None, description="Same seed, same request: same completion.")
    stop: Union[str, list[str], None] = Field(None, description="Strings that end the completion (not included).")
    n: int = Field(1, ge=1, le=1, description="Only 1 choice is supported.")
    stream: bool = Field(False, description="Stream the reply as server-sent events (synthesised from one result).")
    logprobs: bool = Field(False, description="Return the logprob of every completion token.")
    top_logprobs: Optional[int] = Field(None, ge=0, le=20, description="Alternatives per token (with logprobs).")
    return_token_ids: bool = Field(True, description="Accepted for vLLM compatibility; ids are always returned.")
    ignore_eos: bool = Field(False, description="vLLM extension: keep sampling past the end-of-turn token.")

    def budget(self) -> Optional[int]:
        return self.max_completion_tokens or self.max_tokens

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop or [] if s]

    def uses_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


# -- reply ----------------------------------------------------------------------------------------

class TopLogprob(TypedDict):
    """One likely token: its text, log probability and raw bytes (a token may hold part of a UTF-8 character)."""

    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    """A completion token's entry, with the likeliest alternatives (empty unless top_logprobs was asked)."""

    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] = Field(description="One entry per completion token, aligned with token_ids.")


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: Optional[str] = Field(description="Text outside tool calls, or null.")
    tool_calls: Optional[list[ToolCall]] = Field(None, description="Tool calls parsed from the completion.")


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: FinishReason = Field(description="stop (end of turn or a stop string), length, tool_calls.")
    logprobs: Optional[ChoiceLogprobs] = Field(None, description="Present when the request asked for logprobs.")
    token_ids: list[int] = Field(description="The sampled completion tokens, markup and end of turn included.")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    prompt_token_ids: list[int] = Field(description="The exact prompt the engine fed (chat format and tools applied).")


# -- engines --------------------------------------------------------------------------------------

@dataclass
class Generation:
    """What an engine produced for one request."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    text: str
    top_logprobs: Optional[list[list[tuple[int, float]]]] = field(default=None)


class Engine(Protocol):
    """What the HTTP layer needs from a model: its tokenizer, limits and ``generate``."""

    model_name: str
    tokenizer: ChatTokenizer
    max_context: int
    default_max_tokens: int

    async def generate(self, request: ChatRequest, prompt_ids: list[int], max_tokens: int) -> Generation: ...

    async def aclose(self) -> None: ...


# -- turning a generation into a reply ------------------------------------------------------------

def prepare(engine: Engine, request: ChatRequest) -> tuple[list[int], int]:
    """The prompt ids and the completion budget of a request, or a RequestError."""
    messages = [m.model_dump(exclude_none=True) for m in request.messages]
    tools = [t.model_dump(exclude_none=True) for t in request.tools or []] if request.uses_tools() else None
    prompt = engine.tokenizer.prompt_ids(messages, tools)
    room = engine.max_context - len(prompt)
    if room < 1:
        raise RequestError(f"the prompt has {len(prompt)} tokens; this model's context is {engine.max_context}")
    return prompt, min(request.budget() or engine.default_max_tokens, room)


def build_reply(engine: Engine, request: ChatRequest, prompt: list[int], gen: Generation) -> ChatCompletion:
    """The chat.completion for one generation: tool calls parsed, finish reason set, logprobs aligned."""
    if len(gen.logprobs) != len(gen.token_ids):
        raise OrchardError(f"engine returned {len(gen.token_ids)} tokens but {len(gen.logprobs)} logprobs")
    content, calls = hermes.parse(gen.text) if request.uses_tools() else (gen.text or None, [])
    tool_calls = [ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", function=FunctionCall(name=c.name, arguments=c.arguments))
                  for c in calls] or None
    finish = "tool_calls" if tool_calls and gen.finish_reason == "stop" else gen.finish_reason
    choice = Choice(message=AssistantMessage(content=content, tool_calls=tool_calls), finish_reason=finish,
                    logprobs=_logprobs(engine.tokenizer, gen, request.top_logprobs or 0) if request.logprobs else None,
                    token_ids=gen.token_ids)
    used = len(gen.token_ids)
    return ChatCompletion(id=f"chatcmpl-{uuid.uuid4().hex}", created=int(time.time()),
                          model=request.model or engine.model_name, choices=[choice], prompt_token_ids=prompt,
                          usage=Usage(prompt_tokens=len(prompt), completion_tokens=used, total_tokens=len(prompt) + used))


def _logprobs(tokenizer: ChatTokenizer, gen: Generation, top: int) -> ChoiceLogprobs:
    """One entry per token, as plain dicts (this runs for every token of every reply)."""
    entries: list[TokenLogprob] = []
    for i, (token_id, logprob) in enumerate(zip(gen.token_ids, gen.logprobs)):
        text, raw = tokenizer.piece(token_id)
        alternatives = (gen.top_logprobs[i][:top] if gen.top_logprobs and top else [])
        entries.append({"token": text, "logprob": logprob, "bytes": list(raw),
                        "top_logprobs": [_top(tokenizer, t, lp) for t, lp in alternatives]})
    return ChoiceLogprobs.model_construct(content=entries)


def _top(tokenizer: ChatTokenizer, token_id: int, logprob: float) -> TopLogprob:
    text, raw = tokenizer.piece(token_id)
    return {"token": text, "logprob": logprob, "bytes": list(raw)}


def stream_events(reply: ChatCompletion) -> list[str]:
    """The reply as ``chat.completion.chunk`` server-sent events: role, content, tool calls, finish, [DONE]."""
    choice = reply.choices[0]
    head = {"id": reply.id, "object": "chat.completion.chunk", "created": reply.created, "model": reply.model}
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if choice.message.content:
        deltas.append({"content": choice.message.content})
    for i, call in enumerate(choice.message.tool_calls or []):
        deltas.append({"tool_calls": [{"index": i, **call.model_dump()}]})
    chunks = [{**head, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice.finish_reason}],
                   "usage": reply.usage.model_dump(), "prompt_token_ids": reply.prompt_token_ids,
                   "token_ids": choice.token_ids})
    return [f"data: {json.dumps(c, ensure_ascii=False)}\n\n" for c in chunks] + ["data: [DONE]\n\n"]


# -- the app --------------------------------------------------------------------------------------

def create_app(engine: Engine) -> Any:
    """The FastAPI app serving ``engine``: /v1/chat/completions, /v1/models, /health."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import Response, StreamingResponse
    from starlette.exceptions import HTTPException

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        await engine.aclose()

    app = FastAPI(title=f"Orchard model server ({engine.model_name})", lifespan=lifespan)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatRequest) -> Response:
        reply = await complete(engine, request)
        if request.stream:
            return StreamingResponse(iter(stream_events(reply)), media_type="text/event-stream")
        return Response(reply.model_dump_json(), media_type="application/json")

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": engine.model_name, "object": "model", "created": 0,
                                            "owned_by": "orchard", "max_model_len": engine.max_context}]}

    @app.get("/health")
    async def health() -> dict:
        stats = getattr(engine, "stats", None)
        return {"status": "ok", "model": engine.model_name, **({"stats": stats()} if stats else {})}

    app.add_exception_handler(RequestValidationError, lambda _r, e: _error(400, _validation_message(e)))
    app.add_exception_handler(OrchardError, lambda _r, e: _error(e.status_code, e.detail, type(e).__name__))
    app.add_exception_handler(HTTPException, lambda _r, e: _error(e.status_code, str(e.detail)))
    app.add_exception_handler(Exception, lambda _r, e: _error(500, f"{type(e).__name__}: {e}"))
    return app


async def complete(engine: Engine, request: ChatRequest) -> ChatCompletion:
    """Run one request through ``engine``: prompt, generation, reply."""
    prompt, budget = prepare(engine, request)
    generation = await engine.generate(request, prompt, budget)
    return build_reply(engine, request, prompt, generation)


def _error(status: int, message: str, code: str | None = None) -> Any:
    """OpenAI's error body; ``code`` names the Orchard error class when there is one."""
    from fastapi.responses import JSONResponse

    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status_code=status)


def _validation_message(error: Any) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(x) for x in item.get("loc", ()) if x != "body")
        parts.append(f"{where}: {item.get('msg', '')}" if where else item.get("msg", ""))
    return "; ".join(parts) or "invalid request"
