"""The OpenAI Responses dialect (Codex CLI): input items in, response objects and typed event streams out."""

from __future__ import annotations

import json
import time
from typing import Any

from orchard.proxy.dialects.base import ChatCall, Completion, function_tool, new_id, require, require_dict, sampling_params, sse
from orchard.proxy.dialects.openai_chat import error_body  # the same error shape as Chat Completions

NAME = "openai_responses"
TEXT_PARTS = {"input_text", "output_text", "text", "summary_text"}
__all__ = ["NAME", "parse_request", "render_reply", "render_stream", "render_stream_error", "error_body"]


def parse_request(body: Any) -> ChatCall:
    """Check a Responses request and translate its input items to chat messages."""
    body = require_dict(body)
    require(body.get("previous_response_id") is None,
            "'previous_response_id' is not supported: the proxy stores no responses; send the whole input")
    require(isinstance(body.get("model", ""), str), "'model' must be a string")
    instructions = body.get("instructions")
    require(instructions is None or isinstance(instructions, str), "'instructions' must be a string")
    messages = [{"role": "system", "content": instructions}] if instructions else []
    messages += _input_messages(body.get("input"))
    require(len(messages) > 0, "'input' must not be empty")
    tools, notes = _tools(body.get("tools"))
    return ChatCall(model=body.get("model", ""), messages=messages, stream=bool(body.get("stream", False)),
                    tools=tools, tool_choice=_tool_choice(body.get("tool_choice")),
                    params=sampling_params(body, "max_output_tokens", "stop"), notes=notes,
                    echo={k: body.get(k) for k in ("instructions", "tools", "tool_choice", "temperature", "top_p",
                                                    "max_output_tokens", "parallel_tool_calls", "metadata", "store")})


def _input_messages(items: Any) -> list[dict[str, Any]]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    require(isinstance(items, list), "'input' must be a string or a list of items")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        require(isinstance(item, dict), f"input[{i}] must be an object")
        _add_item(messages, item, i)
    return messages


def _add_item(messages: list[dict[str, Any]], item: dict[str, Any], i: int) -> None:
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        role = item.get("role")
        require(role in ("user", "assistant", "system", "developer"), f"input[{i}].role must be user, assistant, system or developer")
        messages.append({"role": "system" if role == "developer" else role, "content": _text(item.get("content"), i)})
    elif kind in ("function_call", "custom_tool_call"):
        _add_tool_call(messages, item, i)
    elif kind in ("function_call_output", "custom_tool_call_output"):
        require(isinstance(item.get("call_id"), str), f"input[{i}] needs a string 'call_id'")
        messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": _text(item.get("output"), i)})
    elif kind != "reasoning":  # reasoning items carry no text the upstream can use
        require(False, f"input[{i}]: item type {kind!r} is not supported")


def _add_tool_call(messages: list[dict[str, Any]], item: dict[str, Any], i: int) -> None:
    """Consecutive calls (and the assistant text before them) form one assistant message, as the model wrote them."""
    require(isinstance(item.get("call_id"), str) and isinstance(item.get("name"), str),
            f"input[{i}] needs string 'call_id' and 'name'")
    if item.get("type") == "custom_tool_call":
        arguments = json.dumps({"input": item.get("input", "")})
    else:
        arguments = item.get("arguments", "")
        require(isinstance(arguments, str), f"input[{i}].arguments must be a JSON string")
    call = {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": arguments}}
    last = messages[-1] if messages else None
    if last is None or last["role"] != "assistant":
        last = {"role": "assistant", "content": None}
        messages.append(last)
    last.setdefault("tool_calls", []).append(call)


def _text(content: Any, i: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    require(isinstance(content, list), f"input[{i}].content must be a string or a list of parts")
    texts = []
    for part in content:
        require(isinstance(part, dict), f"input[{i}]: content parts must be objects")
        kind = part.get("type")
        require(kind not in ("input_image", "input_file", "input_audio"), f"input[{i}]: '{kind}' parts are not supported (text only)")
        if kind == "refusal":
            texts.append(str(part.get("refusal", "")))
            continue
        require(kind in TEXT_PARTS and isinstance(part.get("text"), str), f"input[{i}]: unknown content part {kind!r}")
        texts.append(part["text"])
    return "".join(texts)


def _tools(tools: Any) -> tuple[list[dict[str, Any]] | None, list[str]]:
    """Function tools pass through; built-in tools (web search, local shell, freeform) cannot be called by a chat model."""
    if tools is None:
        return None, []
    require(isinstance(tools, list), "'tools' must be a list")
    out, notes = [], []
    for tool in tools:
        require(isinstance(tool, dict), "each tool must be an object")
        if tool.get("type") == "function":
            out.append(function_tool(tool.get("name"), tool.get("description"), tool.get("parameters")))
        else:
            notes.append(f"dropped tool of type {tool.get('type')!r} ({tool.get('name', '')})")
    return out or None, notes


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    require(choice is None or choice in ("auto", "none", "required"), f"unsupported tool_choice {choice!r}")
    return choice


def _items(done: Completion) -> list[dict[str, Any]]:
    items = []
    if done.content:
        items.append({"id": new_id("msg_"), "type": "message", "status": "completed", "role": "assistant",
                      "content": [{"type": "output_text", "text": done.content, "annotations": [], "logprobs": []}]})
    for tool in done.tool_calls:
        items.append({"id": new_id("fc_"), "type": "function_call", "status": "completed", "call_id": tool.id,
                      "name": tool.name, "arguments": tool.arguments})
    return items


def _response(done: Completion, call: ChatCall, output: list[dict[str, Any]], status: str) -> dict[str, Any]:
    echo = call.echo
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {"id": call.echo.get("_id") or new_id("resp_"), "object": "response", "created_at": done.created,
            "status": status, "error": None, "incomplete_details": incomplete, "instructions": echo.get("instructions"),
            "max_output_tokens": echo.get("max_output_tokens"), "model": done.model, "output": output,
            "parallel_tool_calls": echo.get("parallel_tool_calls", True) is not False, "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None}, "store": bool(echo.get("store", False)),
            "temperature": echo.get("temperature"), "text": {"format": {"type": "text"}},
            "tool_choice": echo.get("tool_choice") or "auto", "tools": echo.get("tools") or [], "top_p": echo.get("top_p"),
            "truncation": "disabled", "usage": _usage(done) if status != "in_progress" else None, "user": None,
            "metadata": echo.get("metadata") or {}}


def _usage(done: Completion) -> dict[str, Any]:
    return {"input_tokens": done.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": done.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": done.prompt_tokens + done.completion_tokens}


def _status(done: Completion) -> str:
    return "incomplete" if done.finish_reason == "length" else "completed"


def render_reply(done: Completion, call: ChatCall) -> dict[str, Any]:
    """A ``response`` object with message and function_call output items."""
    return _response(done, call, _items(done), _status(done))


def render_stream(done: Completion, call: ChatCall) -> bytes:
    """The typed event stream: created, in_progress, per item added/deltas/done, then completed (or incomplete)."""
    call.echo["_id"] = new_id("resp_")
    events: list[dict[str, Any]] = []
    start = _response(done, call, [], "in_progress")
    events += [{"type": "response.created", "response": start}, {"type": "response.in_progress", "response": start}]
    output = _items(done)
    for index, item in enumerate(output):
        events += _message_events(item, index) if item["type"] == "message" else _call_events(item, index)
    status = _status(done)
    events.append({"type": f"response.{status}", "response": _response(done, call, output, status)})
    return b"".join(sse({**event, "sequence_number": n}, event["type"]) for n, event in enumerate(events))


def _message_events(item: dict[str, Any], index: int) -> list[dict[str, Any]]:
    text = item["content"][0]["text"]
    where = {"item_id": item["id"], "output_index": index, "content_index": 0}
    empty_part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    return [{"type": "response.output_item.added", "output_index": index, "item": {**item, "status": "in_progress", "content": []}},
            {"type": "response.content_part.added", **where, "part": empty_part},
            {"type": "response.output_text.delta", **where, "delta": text, "logprobs": []},
            {"type": "response.output_text.done", **where, "text": text, "logprobs": []},
            {"type": "response.content_part.done", **where, "part": item["content"][0]},
            {"type": "response.output_item.done", "output_index": index, "item": item}]


def _call_events(item: dict[str, Any], index: int) -> list[dict[str, Any]]:
    where = {"item_id": item["id"], "output_index": index}
    return [{"type": "response.output_item.added", "output_index": index, "item": {**item, "status": "in_progress", "arguments": ""}},
            {"type": "response.function_call_arguments.delta", **where, "delta": item["arguments"]},
            {"type": "response.function_call_arguments.done", **where, "arguments": item["arguments"]},
            {"type": "response.output_item.done", "output_index": index, "item": item}]



def render_stream_error(body: dict[str, Any]) -> bytes:
    """An error after the stream opened: ``response.failed`` with the error, as the Responses API ends a failed stream."""
    error = body.get("error") or {}
    response = {"id": new_id("resp_"), "object": "response", "created_at": int(time.time()), "status": "failed",
                "error": {"code": error.get("code") or "server_error", "message": error.get("message", "")},
                "incomplete_details": None, "output": [], "usage": None}
    return sse({"type": "response.failed", "response": response, "sequence_number": 0}, "response.failed")
