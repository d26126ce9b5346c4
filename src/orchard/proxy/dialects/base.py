"""What every dialect turns its requests into and renders its replies from: ChatCall, Completion, ToolCall."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from orchard.errors import RequestError
from orchard.proxy import fastjson


@dataclass
class ChatCall:
    """A harness request translated to an upstream Chat Completions call."""

    model: str
    messages: list[dict[str, Any]]
    stream: bool = False
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Any = None
    params: dict[str, Any] = field(default_factory=dict)
    """Sampling parameters passed through: max_tokens, temperature, top_p, stop, seed, top_logprobs."""
    include_usage: bool = False
    """Chat streaming only: the caller asked for a final usage chunk."""
    notes: list[str] = field(default_factory=list)
    """Things the translation dropped (e.g. tool types a chat model cannot call), kept with the record."""
    echo: dict[str, Any] = field(default_factory=dict)
    """Request fields the dialect echoes back in its reply (e.g. Responses' instructions and tools)."""

    def upstream_body(self, model: Optional[str] = None) -> dict[str, Any]:
        """The body sent upstream: never streaming, always asking for token ids and logprobs."""
        body: dict[str, Any] = {"model": model or self.model, "messages": self.messages, "stream": False,
                                "logprobs": True, "top_logprobs": self.params.get("top_logprobs", 0),
                                "return_token_ids": True}
        if self.tools:
            body["tools"] = self.tools
            if self.tool_choice is not None:
                body["tool_choice"] = self.tool_choice
        for key in ("max_tokens", "temperature", "top_p", "stop", "seed"):
            if self.params.get(key) is not None:
                body[key] = self.params[key]
        return body


@dataclass
class ToolCall:
    """One tool call the model made."""

    id: str
    name: str
    arguments: str
    """JSON text of the arguments, as the engine produced it."""

    def arguments_object(self) -> dict[str, Any]:
        """The arguments as an object (Anthropic's ``input``); text that is not a JSON object is wrapped."""
        try:
            value = json.loads(self.arguments) if self.arguments else {}
        except ValueError:
            return {"_raw_arguments": self.arguments}
        return value if isinstance(value, dict) else {"_raw_arguments": self.arguments}


@dataclass
class Completion:
    """The upstream's reply, normalised: what every dialect renders."""

    model: str
    content: Optional[str]
    tool_calls: list[ToolCall]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    created: int = field(default_factory=lambda: int(time.time()))
    stop_sequence: Optional[str] = None
    """The stop string that ended sampling, when the engine says (vLLM's ``stop_reason``)."""


def new_id(prefix: str) -> str:
    """A fresh identifier in the style of the dialect (``chatcmpl-…``, ``resp_…``, ``msg_…``)."""
    return prefix + secrets.token_hex(12)


def require(condition: bool, message: str) -> None:
    """Refuse a malformed request with a RequestError (rendered in the caller's dialect)."""
    if not condition:
        raise RequestError(message)


def require_dict(body: Any) -> dict[str, Any]:
    require(isinstance(body, dict), "the request body must be a JSON object")
    return body


def sse(data: Any, event: Optional[str] = None) -> bytes:
    """One server-sent event; ``data`` is JSON-encoded unless it is already text."""
    payload = data.encode() if isinstance(data, str) else fastjson.dumps(data)
    return (f"event: {event}\n".encode() if event else b"") + b"data: " + payload + b"\n\n"


def sampling_params(body: dict[str, Any], max_tokens_key: str, stop_key: str) -> dict[str, Any]:
    """Pick and check the sampling parameters a dialect shares with Chat Completions."""
    params = {"max_tokens": body.get(max_tokens_key), "temperature": body.get("temperature"),
              "top_p": body.get("top_p"), "stop": body.get(stop_key), "seed": body.get("seed")}
    for key in ("max_tokens", "seed"):
        require(params[key] is None or (isinstance(params[key], int) and not isinstance(params[key], bool)),
                f"'{max_tokens_key if key == 'max_tokens' else key}' must be an integer")
    require(params["max_tokens"] is None or params["max_tokens"] > 0, f"'{max_tokens_key}' must be positive")
    for key in ("temperature", "top_p"):
        require(params[key] is None or isinstance(params[key], (int, float)), f"'{key}' must be a number")
    stop = params["stop"]
    require(stop is None or isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop)),
            f"'{stop_key}' must be a string or a list of strings")
    return {k: v for k, v in params.items() if v is not None}


def function_tool(name: Any, description: Any, parameters: Any) -> dict[str, Any]:
    """A Chat Completions function tool, checked."""
    require(isinstance(name, str) and name != "", "every tool needs a non-empty string 'name'")
    require(parameters is None or isinstance(parameters, dict), f"tool '{name}': the parameter schema must be an object")
    function: dict[str, Any] = {"name": name, "parameters": parameters or {"type": "object", "properties": {}}}
    if description:
        function["description"] = str(description)
    return {"type": "function", "function": function}
