"""The Anthropic Messages dialect (Claude Code): content blocks in, messages and their event streams out."""

from __future__ import annotations

import json
from typing import Any

from orchard.proxy.dialects.base import ChatCall, Completion, function_tool, new_id, require, require_dict, sampling_params, sse

NAME = "anthropic_messages"
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
IGNORED_BLOCKS = {"thinking", "redacted_thinking"}


def parse_request(body: Any) -> ChatCall:
    """Check a Messages request and translate system, content blocks and tools to chat messages."""
    require(isinstance(require_dict(body).get("max_tokens"), int), "max_tokens: Field required (an integer)")
    return parse_count_request(body)


def parse_count_request(body: Any) -> ChatCall:
    """Check a ``count_tokens`` request (a Messages request without ``max_tokens``)."""
    body = require_dict(body)
    require(isinstance(body.get("model"), str), "model: Field required (a string)")
    raw = body.get("messages")
    require(isinstance(raw, list) and len(raw) > 0, "messages: must be a non-empty list")
    messages = _system(body.get("system"))
    for i, message in enumerate(raw):
        messages += _messages(message, i)
    return ChatCall(model=body["model"], messages=messages, stream=bool(body.get("stream", False)),
                    tools=_tools(body.get("tools")), tool_choice=_tool_choice(body.get("tool_choice")),
                    params=sampling_params(body, "max_tokens", "stop_sequences"))


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None or system == "" or system == []:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    require(isinstance(system, list), "system: must be a string or a list of text blocks")
    texts = []
    for block in system:
        require(isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str),
                "system: every block must be a text block")
        texts.append(block["text"])
    return [{"role": "system", "content": "\n\n".join(texts)}]


def _messages(message: Any, i: int) -> list[dict[str, Any]]:
    require(isinstance(message, dict) and message.get("role") in ("user", "assistant", "system"),
            f"messages.{i}: role must be 'user', 'assistant' or 'system'")
    content = message.get("content")
    if message["role"] == "system":     # Claude Code 2.1 puts system reminders between turns
        return _system(content)
    if isinstance(content, str):
        return [{"role": message["role"], "content": content}]
    require(isinstance(content, list), f"messages.{i}.content: must be a string or a list of blocks")
    return _assistant(content, i) if message["role"] == "assistant" else _user(content, i)


def _assistant(blocks: list[Any], i: int) -> list[dict[str, Any]]:
    texts, calls = [], []
    for j, block in enumerate(_checked(blocks, i)):
        if block["type"] == "text":
            texts.append(_block_text(block, i, j))
        elif block["type"] == "tool_use":
            require(isinstance(block.get("id"), str) and isinstance(block.get("name"), str),
                    f"messages.{i}.content.{j}: tool_use needs string 'id' and 'name'")
            calls.append({"id": block["id"], "type": "function",
                          "function": {"name": block["name"], "arguments": json.dumps(block.get("input", {}), ensure_ascii=False)}})
        else:
            require(block["type"] in IGNORED_BLOCKS, f"messages.{i}.content.{j}: block type {block['type']!r} not allowed in an assistant turn")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    return [message]


def _user(blocks: list[Any], i: int) -> list[dict[str, Any]]:
    """Tool results become tool messages (first, as the API requires); the remaining text one user message."""
    results, texts = [], []
    for j, block in enumerate(_checked(blocks, i)):
        if block["type"] == "tool_result":
            require(isinstance(block.get("tool_use_id"), str), f"messages.{i}.content.{j}: tool_result needs a string 'tool_use_id'")
            text = _result_text(block.get("content"), i, j)
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                            "content": f"Error: {text}" if block.get("is_error") else text})
        elif block["type"] == "text":
            texts.append(_block_text(block, i, j))
        else:
            _refuse(block["type"], i, j)
    return results + ([{"role": "user", "content": "\n".join(texts)}] if texts else [])


def _checked(blocks: list[Any], i: int) -> list[dict[str, Any]]:
    for j, block in enumerate(blocks):
        require(isinstance(block, dict) and isinstance(block.get("type"), str), f"messages.{i}.content.{j}: a block must be an object with a 'type'")
    return blocks


def _refuse(kind: str, i: int, j: int) -> None:
    if kind in ("image", "document"):
        require(False, f"messages.{i}.content.{j}: {kind} blocks are not supported (the upstream model reads text only)")
    require(kind in IGNORED_BLOCKS, f"messages.{i}.content.{j}: unknown block type {kind!r}")


def _block_text(block: dict[str, Any], i: int, j: int) -> str:
    require(isinstance(block.get("text"), str), f"messages.{i}.content.{j}: a text block needs a string 'text'")
    return block["text"]


def _result_text(content: Any, i: int, j: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    require(isinstance(content, list), f"messages.{i}.content.{j}: tool_result content must be a string or a list of blocks")
    texts = []
    for block in _checked(content, i):
        if block["type"] != "text":
            _refuse(block["type"], i, j)
        texts.append(_block_text(block, i, j))
    return "\n".join(texts)


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    require(isinstance(tools, list), "tools: must be a list")
    out = []
    for tool in tools:
        require(isinstance(tool, dict), "tools: every tool must be an object")
        require(tool.get("type") in (None, "custom"), f"tools: server tool type {tool.get('type')!r} is not supported")
        out.append(function_tool(tool.get("name"), tool.get("description"), tool.get("input_schema")))
    return out or None


def _tool_choice(choice: Any) -> Any:
    if choice is None:
        return None
    require(isinstance(choice, dict) and choice.get("type") in ("auto", "any", "tool", "none"),
            "tool_choice: type must be auto, any, tool or none")
    if choice["type"] == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice["type"]]


def _blocks(done: Completion) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": done.content}] if done.content else []
    blocks += [{"type": "tool_use", "id": t.id, "name": t.name, "input": t.arguments_object()} for t in done.tool_calls]
    return blocks


def _stop_reason(done: Completion) -> str:
    if done.finish_reason == "stop" and done.stop_sequence:
        return "stop_sequence"
    return STOP_REASONS.get(done.finish_reason, "end_turn")


def _message(done: Completion, content: list[dict[str, Any]], stop_reason: str | None, output_tokens: int) -> dict[str, Any]:
    return {"id": new_id("msg_"), "type": "message", "role": "assistant", "model": done.model, "content": content,
            "stop_reason": stop_reason, "stop_sequence": done.stop_sequence if stop_reason == "stop_sequence" else None,
            "usage": {"input_tokens": done.prompt_tokens, "output_tokens": output_tokens,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}


def render_reply(done: Completion, call: ChatCall) -> dict[str, Any]:
    """A ``message`` object with text and tool_use blocks."""
    return _message(done, _blocks(done), _stop_reason(done), done.completion_tokens)


def render_stream(done: Completion, call: ChatCall) -> bytes:
    """message_start, ping, per block start/delta/stop, message_delta (stop_reason, usage), message_stop."""
    events: list[dict[str, Any]] = [{"type": "message_start", "message": _message(done, [], None, 1)}, {"type": "ping"}]
    for index, block in enumerate(_blocks(done)):
        if block["type"] == "text":
            start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
        else:
            start = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}
        events += [{"type": "content_block_start", "index": index, "content_block": start},
                   {"type": "content_block_delta", "index": index, "delta": delta},
                   {"type": "content_block_stop", "index": index}]
    stop_reason = _stop_reason(done)
    stop_sequence = done.stop_sequence if stop_reason == "stop_sequence" else None
    events += [{"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                "usage": {"output_tokens": done.completion_tokens}},
               {"type": "message_stop"}]
    return b"".join(sse(event, event["type"]) for event in events)


ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
               413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}


def error_body(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """Anthropic's error shape: ``{"type": "error", "error": {"type", "message"}}``."""
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def count_tokens(call: ChatCall) -> int:
    """A rough count for ``/v1/messages/count_tokens`` (about four characters a token): harnesses use it only to budget context."""
    text = json.dumps(call.messages, ensure_ascii=False) + json.dumps(call.tools or [], ensure_ascii=False)
    return max(1, len(text) // 4)


def render_stream_error(body: dict[str, Any]) -> bytes:
    """An error after the stream opened: Anthropic's ``error`` event."""
    return sse(body, "error")
