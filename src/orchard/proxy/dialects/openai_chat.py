"""The OpenAI Chat Completions dialect (mini-swe-agent, OpenCode, most SDKs): requests in, replies and chunk streams out."""

from __future__ import annotations

from typing import Any

from orchard.proxy.dialects.base import ChatCall, Completion, function_tool, new_id, require, require_dict, sampling_params, sse

NAME = "openai_chat"
ROLES = {"system", "developer", "user", "assistant", "tool"}


def parse_request(body: Any) -> ChatCall:
    """Check a Chat Completions request and keep what upstream needs."""
    body = require_dict(body)
    require(isinstance(body.get("model", ""), str), "'model' must be a string")
    messages = body.get("messages")
    require(isinstance(messages, list) and len(messages) > 0, "'messages' must be a non-empty list")
    require(body.get("n", 1) == 1, "only n=1 is supported")
    max_key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    params = sampling_params(body, max_key, "stop")
    if isinstance(body.get("top_logprobs"), int):
        params["top_logprobs"] = body["top_logprobs"]
    options = body.get("stream_options") or {}
    require(isinstance(options, dict), "'stream_options' must be an object")
    return ChatCall(model=body.get("model", ""), messages=[_message(m, i) for i, m in enumerate(messages)],
                    stream=bool(body.get("stream", False)), tools=_tools(body.get("tools")),
                    tool_choice=body.get("tool_choice"), params=params, include_usage=bool(options.get("include_usage")))


def _message(message: Any, i: int) -> dict[str, Any]:
    require(isinstance(message, dict), f"messages[{i}] must be an object")
    role = message.get("role")
    require(role in ROLES, f"messages[{i}].role must be one of {sorted(ROLES)}")
    out = {**message, "role": "system" if role == "developer" else role, "content": _content(message.get("content"), i)}
    if role == "assistant" and message.get("tool_calls"):
        require(isinstance(message["tool_calls"], list), f"messages[{i}].tool_calls must be a list")
    if role == "tool":
        require(isinstance(message.get("tool_call_id"), str), f"messages[{i}] (tool) needs a string 'tool_call_id'")
    return out


def _content(content: Any, i: int) -> Any:
    """Text parts are joined into one string; images and audio are refused (the upstream model reads text)."""
    if content is None or isinstance(content, str):
        return content
    require(isinstance(content, list), f"messages[{i}].content must be a string or a list of parts")
    texts = []
    for part in content:
        require(isinstance(part, dict), f"messages[{i}].content parts must be objects")
        kind = part.get("type")
        require(kind not in ("image_url", "input_audio", "file"), f"messages[{i}]: '{kind}' parts are not supported (text only)")
        require(kind in ("text", "refusal") and isinstance(part.get(kind), str), f"messages[{i}]: unknown content part {kind!r}")
        texts.append(part[kind])
    return "".join(texts)


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    require(isinstance(tools, list), "'tools' must be a list")
    out = []
    for tool in tools:
        require(isinstance(tool, dict) and tool.get("type", "function") == "function" and isinstance(tool.get("function"), dict),
                "each tool must be {'type': 'function', 'function': {...}}")
        fn = tool["function"]
        out.append(function_tool(fn.get("name"), fn.get("description"), fn.get("parameters")))
    return out or None


def render_reply(done: Completion, call: ChatCall) -> dict[str, Any]:
    """A ``chat.completion`` object."""
    message: dict[str, Any] = {"role": "assistant", "content": done.content}
    if done.tool_calls:
        message["tool_calls"] = [{"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
                                 for t in done.tool_calls]
    return {"id": new_id("chatcmpl-"), "object": "chat.completion", "created": done.created, "model": done.model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": done.finish_reason}],
            "usage": _usage(done)}


def _usage(done: Completion) -> dict[str, int]:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens}


def render_stream(done: Completion, call: ChatCall) -> bytes:
    """``chat.completion.chunk`` events (role, content, tool-call deltas, finish), optional usage, then ``[DONE]``."""
    head = {"id": new_id("chatcmpl-"), "object": "chat.completion.chunk", "created": done.created, "model": done.model}
    usage_field = {"usage": None} if call.include_usage else {}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse({**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}], **usage_field})

    events = [chunk({"role": "assistant", "content": ""})]
    if done.content:
        events.append(chunk({"content": done.content}))
    for i, tool in enumerate(done.tool_calls):
        events.append(chunk({"tool_calls": [{"index": i, "id": tool.id, "type": "function",
                                             "function": {"name": tool.name, "arguments": ""}}]}))
        events.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": tool.arguments}}]}))
    events.append(chunk({}, done.finish_reason))
    if call.include_usage:
        events.append(sse({**head, "choices": [], "usage": _usage(done)}))
    events.append(sse("[DONE]"))
    return b"".join(events)


ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
               413: "invalid_request_error", 429: "rate_limit_error"}


def error_body(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def render_stream_error(body: dict[str, Any]) -> bytes:
    """An error after the stream opened: a data event holding ``error`` (the SDKs raise it), then ``[DONE]``."""
    return sse(body) + sse("[DONE]")
