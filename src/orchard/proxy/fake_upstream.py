"""A minimal, fast OpenAI-compatible upstream with byte-level tokens, for the proxy's tests and benchmark."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable, Optional

Policy = Callable[[list[dict[str, Any]], Optional[list[dict[str, Any]]]], dict[str, Any]]
"""Maps (messages, tools) to a reply: ``{"content": str | None, "tool_calls": [{"name", "arguments": dict}]}``;
optional keys ``finish_reason``, ``stop_reason`` (the stop string that matched), ``delay`` (seconds to wait first)
and ``status`` (answer with that HTTP error)."""

END = "<|im_end|>"


def render_prompt(messages: list[dict[str, Any]], tools: Optional[list[dict[str, Any]]]) -> str:
    """A ChatML-like template, so that a re-sent history renders to exactly the tokens the model sampled."""
    head = f"<|im_start|>system\ntools: {json.dumps(tools, sort_keys=True)}{END}\n" if tools else ""
    return head + "".join(_render_message(m) for m in messages) + "<|im_start|>assistant\n"


def _render_message(message: dict[str, Any]) -> str:
    text = message.get("content") or ""
    if message["role"] == "assistant":
        return f"<|im_start|>assistant\n{render_completion(text, message.get('tool_calls') or [])}\n"
    return f"<|im_start|>{message['role']}\n{text}{END}\n"


def render_completion(content: str, tool_calls: list[dict[str, Any]]) -> str:
    """The raw text the model 'sampled': content, Hermes-style tool-call blocks, end of turn."""
    blocks = []
    for call in tool_calls:
        fn = call.get("function", call)
        arguments = fn["arguments"]
        arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        blocks.append("<tool_call>\n" + json.dumps({"name": fn["name"], "arguments": arguments}) + "\n</tool_call>")
    return content + "".join(blocks) + END


def tokens(text: str) -> list[int]:
    """Byte-level token ids."""
    return list(text.encode())


def echo_policy(messages: list[dict[str, Any]], tools: Optional[list[dict[str, Any]]]) -> dict[str, Any]:
    """Answers every call with a short fixed text."""
    return {"content": "ok"}


class FakeUpstream:
    """An ASGI app serving ``POST /v1/chat/completions``, ``GET /v1/models`` and ``GET /health``."""

    def __init__(self, policy: Policy = echo_policy, token_ids: bool = True, model: str = "fake-model", keep: bool = True):
        self.policy, self.token_ids, self.model, self.keep = policy, token_ids, model, keep
        """``keep=False`` (the benchmark): forget requests and headers instead of keeping every one for tests to read."""
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        """The headers of every chat call (tests check which key reached the upstream)."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if self.keep and scope["path"].endswith("/chat/completions"):
            self.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        status, reply = await self._answer(scope["method"], scope["path"], body)
        data = json.dumps(reply).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})

    async def _answer(self, method: str, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
        if method == "GET" and path.rstrip("/") in ("/v1/models", "/models"):
            return 200, {"object": "list", "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "fake"}]}
        if method == "GET" and path == "/health":
            return 200, {"status": "ok"}
        if method != "POST" or not path.endswith("/chat/completions"):
            return 404, {"error": {"message": "not found", "type": "not_found_error"}}
        request = json.loads(body)
        if self.keep:
            self.requests.append(request)
        decision = self.policy(request["messages"], request.get("tools"))
        if decision.get("delay"):
            await asyncio.sleep(decision["delay"])
        if decision.get("status"):
            return decision["status"], {"error": {"message": "scripted failure", "type": "server_error"}}
        return 200, self.completion(request, decision)

    def completion(self, request: dict[str, Any], decision: dict[str, Any]) -> dict[str, Any]:
        """A chat.completion with vLLM-style ``prompt_token_ids`` and ``token_ids`` and aligned logprobs."""
        calls = [{"id": f"call_{i}_{len(self.requests)}", "type": "function",
                  "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
                 for i, c in enumerate(decision.get("tool_calls") or [])]
        prompt = tokens(render_prompt(request["messages"], request.get("tools")))
        sampled = tokens(render_completion(decision.get("content") or "", calls))
        choice: dict[str, Any] = {"index": 0, "finish_reason": decision.get("finish_reason") or ("tool_calls" if calls else "stop"),
                                  "stop_reason": decision.get("stop_reason"),
                                  "message": {"role": "assistant", "content": decision.get("content"), "tool_calls": calls or None}}
        reply: dict[str, Any] = {"id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": request.get("model") or self.model,
                                 "choices": [choice], "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(sampled),
                                                                "total_tokens": len(prompt) + len(sampled)}}
        if self.token_ids:
            reply["prompt_token_ids"] = prompt
            choice["token_ids"] = sampled
            choice["logprobs"] = {"content": [{"token": chr(t), "logprob": -0.5, "bytes": [t], "top_logprobs": []} for t in sampled]}
        return reply
