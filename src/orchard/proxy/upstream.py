"""The one client for the upstream model server: send a Chat Completions call, check and normalise its reply."""

from __future__ import annotations

import array
import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import msgspec

from orchard.errors import RequestError, UpstreamError, UpstreamNoTokensError, UpstreamTimeoutError
from orchard.proxy import fastjson
from orchard.proxy.http1 import Pool
from orchard.proxy.dialects.base import Completion, ToolCall, new_id

FINISH_REASONS = {"stop", "length", "tool_calls"}


@dataclass
class UpstreamResult:
    """A checked upstream reply: the raw body, its normalised completion and the engine's tokens."""

    reply: dict[str, Any]
    completion: Completion
    raw: bytes = b""
    """The reply body as received (recorded as is, not re-encoded)."""
    prompt_token_ids: "list[int] | RawIds" = field(default_factory=list)
    """Only counted here (the recorder keeps them inside ``raw``)."""
    completion_token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    seconds: float = 0.0


class Upstream:
    """A pooled keep-alive HTTP/1.1 client (see http1.py) for one OpenAI-compatible server; the proxy's own upstream
    key is added here and nowhere else. Create it inside the running event loop."""

    def __init__(self, base_url: str, api_key: Optional[str] = None, timeout_s: float = 600.0, max_connections: int = 1024):
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        headers = {"content-type": "application/json"} | ({"authorization": f"Bearer {api_key}"} if api_key else {})
        self.pool = Pool(self.base_url, headers, timeout_s, connect_timeout_s=10, limit=max_connections)

    async def aclose(self) -> None:
        self.pool.close()

    async def complete(self, payload: bytes, model_name: str, text_only: bool) -> UpstreamResult:
        """Send one encoded Chat Completions body; raise UpstreamError (infrastructure) or RequestError (refused)."""
        started = time.perf_counter()
        raw = await self._post(payload)
        result = parse_reply(decode_reply(raw), model_name, text_only)
        result.raw, result.seconds = raw, time.perf_counter() - started
        return result

    async def models(self) -> list[dict[str, Any]]:
        """The upstream's model list, or an empty list when it has none to give."""
        try:
            reply = await self.pool.request("GET", "/models")
            data = fastjson.loads(reply.body).get("data", []) if reply.status == 200 else []
        except (OSError, asyncio.TimeoutError, ValueError, AttributeError):
            return []
        return [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]

    async def _post(self, payload: bytes) -> bytes:
        try:
            reply = await self.pool.request("POST", "/chat/completions", payload)
        except asyncio.TimeoutError as e:
            raise UpstreamTimeoutError("the upstream model server did not answer in time") from e
        except OSError as e:
            raise UpstreamError(f"the upstream model server cannot be reached: {type(e).__name__}: {e}") from e
        return _checked_status(reply.status, reply.body)


def _checked_status(status: int, raw: bytes) -> bytes:
    text = raw[:500].decode(errors="replace")
    if status >= 500 or status in (401, 403, 404, 408, 429):
        raise UpstreamError(f"the upstream model server failed: HTTP {status}: {text}")
    if status >= 400:
        raise RequestError(f"the upstream model server refused the request: HTTP {status}: {text}")
    return raw


class RawIds:
    """Top-level prompt ids that are a flat JSON list of integers, kept as their bytes: checked and counted without
    decoding 10^4-10^5 Python ints per call."""

    __slots__ = ("count",)

    def __init__(self, text: bytes):
        self.count = text.count(b",") + 1 if text.translate(None, b"[], \t\r\n") else 0

    def __len__(self) -> int:
        return self.count


class _ReplyHead(msgspec.Struct):
    """What parse_reply reads of a reply; msgspec checks ``prompt_token_ids`` is well-formed JSON but leaves it as bytes."""

    choices: Any = None
    usage: Any = None
    prompt_token_ids: msgspec.Raw = msgspec.Raw()


_HEAD = msgspec.json.Decoder(_ReplyHead)
_ID_BYTES = b"0123456789,- \t\r\n"


def decode_reply(raw: bytes) -> dict[str, Any]:
    """The reply's ``choices``, ``usage`` and ``prompt_token_ids`` (a RawIds when they are a flat list of integers);
    anything else (not an object, NaN, ids of another shape) takes the general path and its errors."""
    try:
        head = _HEAD.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return _checked_json(raw)
    reply = {"choices": head.choices, "usage": head.usage}
    ids = bytes(head.prompt_token_ids)
    if ids:
        if ids.translate(None, _ID_BYTES) != b"[]":
            return _checked_json(raw)
        reply["prompt_token_ids"] = RawIds(ids)
    return reply


def _checked_json(raw: bytes) -> dict[str, Any]:
    try:
        body = fastjson.loads(raw)
    except ValueError as e:
        raise UpstreamError("the upstream model server replied with something that is not JSON") from e
    if not isinstance(body, dict):
        raise UpstreamError("the upstream model server's reply is not a JSON object")
    return body


def parse_reply(reply: dict[str, Any], model_name: str, text_only: bool) -> UpstreamResult:
    """Normalise a ``chat.completion`` reply and take the engine's token ids and logprobs from it."""
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise UpstreamError("the upstream reply has no choices")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    completion = Completion(model=model_name, content=message.get("content") or None,
                            tool_calls=_tool_calls(message.get("tool_calls")), finish_reason=_finish(choice),
                            prompt_tokens=0, completion_tokens=0,
                            stop_sequence=choice.get("stop_reason") if isinstance(choice.get("stop_reason"), str) else None)
    result = UpstreamResult(reply=reply, completion=completion)
    try:
        _take_tokens(result, reply, choice)
    except UpstreamNoTokensError:
        if not text_only:
            raise
    usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else {}
    completion.prompt_tokens = int(usage.get("prompt_tokens") or len(result.prompt_token_ids))
    completion.completion_tokens = int(usage.get("completion_tokens") or len(result.completion_token_ids))
    return result


def _finish(choice: dict[str, Any]) -> str:
    reason = choice.get("finish_reason") or "stop"
    return reason if reason in FINISH_REASONS else ("tool_calls" if reason == "function_call" else "stop")


def _tool_calls(raw: Any) -> list[ToolCall]:
    calls = []
    for item in raw or []:
        fn = item.get("function") if isinstance(item, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise UpstreamError("the upstream reply holds a malformed tool call")
        arguments = fn.get("arguments")
        calls.append(ToolCall(id=item.get("id") or new_id("call_"), name=fn["name"],
                              arguments=arguments if isinstance(arguments, str) else json.dumps(arguments or {})))
    return calls


def _take_tokens(result: UpstreamResult, reply: dict[str, Any], choice: dict[str, Any]) -> None:
    prompt_ids = reply.get("prompt_token_ids", choice.get("prompt_token_ids"))
    completion_ids = choice.get("token_ids")
    if not _is_ids(prompt_ids) or not _is_ids(completion_ids):
        raise UpstreamNoTokensError(
            "the upstream model server returned no token ids (prompt_token_ids and choices[0].token_ids, as vLLM does "
            "with return_token_ids): training needs the engine's own tokens. Point the proxy at an engine that returns "
            "them, or open the session with text_only=true to record text only")
    content = (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), dict) else None
    if not isinstance(content, list) or len(content) != len(completion_ids):
        raise UpstreamError(f"the upstream's logprobs ({len(content) if isinstance(content, list) else 'none'}) "
                            f"are not aligned with its {len(completion_ids)} completion token ids")
    result.prompt_token_ids, result.completion_token_ids = prompt_ids, completion_ids
    result.logprobs = [float(entry.get("logprob", 0.0)) for entry in content]


def _is_ids(value: Any) -> bool:
    """A list of integers; prompts run to 10^5 ids, so the check is one C loop (array refuses floats, strings, None)."""
    if isinstance(value, RawIds):
        return True
    if not isinstance(value, list):
        return False
    try:
        array.array("q", value)
        return True
    except TypeError:
        return False
    except OverflowError:  # integers beyond 64 bits are still integers
        return all(isinstance(t, int) for t in value)
