"""An engine whose replies come from a script or a Python policy, with token ids from the model's real tokenizer.

A reply's raw text is its content followed by one Hermes ``<tool_call>`` block per call (``hermes.render_turn``);
its completion ids are that text tokenized, plus the end-of-turn token; every logprob is 0.0. So
``tokenizer.decode(token_ids)`` is exactly the scripted text followed by ``<|im_end|>``, and the next prompt
renders that turn back to the same ids.

Script file (JSON or YAML): a list of replies, or an object::

    replies: ["plain text", {content: ..., tool_calls: [{name: bash, arguments: {command: ls}}]}]
    sessions: {MARKER: [...]}   # a request whose messages contain MARKER takes the next reply of that list
    cursor: order               # order: each request consumes the next reply; turn: reply = assistant turns so far
    when_done: error            # error (500) or repeat_last when a list runs out
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
from pathlib import Path
from typing import Any, Awaitable, Callable, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from orchard.errors import ModelError, RequestError
from orchard.inference import hermes
from orchard.inference.api import ChatRequest, Generation
from orchard.inference.chat import ChatTokenizer

Policy = Callable[[ChatRequest], Union["Reply", str, dict, Awaitable[Any]]]


class ScriptedCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="The function to call.")
    arguments: Union[dict[str, Any], str] = Field(default_factory=dict, description="A JSON object (or its text).")


class Reply(BaseModel):
    """One scripted assistant turn."""

    model_config = ConfigDict(extra="forbid")
    content: Optional[str] = Field(None, description="Text before any tool calls.")
    tool_calls: list[ScriptedCall] = Field(default_factory=list, description="Calls, rendered as Hermes blocks.")
    finish_reason: Literal["stop", "length"] = Field(
        "stop", description="stop appends the end-of-turn token; length leaves the turn unfinished.")

    def text(self) -> str:
        """The raw text a model would have produced for this turn (without the end-of-turn token)."""
        return hermes.render_turn(self.content, [(c.name, c.arguments) for c in self.tool_calls])


class Script(BaseModel):
    """Replies to hand out, in order, for everyone or per session marker."""

    model_config = ConfigDict(extra="forbid")
    replies: list[Reply] = Field(default_factory=list, description="Replies for requests that match no session.")
    sessions: dict[str, list[Reply]] = Field(
        default_factory=dict, description="Marker -> replies; a request belongs to the first marker its messages contain.")
    cursor: Literal["order", "turn"] = Field(
        "order", description="order: consume the next reply; turn: index = assistant messages in the request.")
    when_done: Literal["error", "repeat_last"] = Field("error", description="What happens after the last reply.")

    @field_validator("replies", mode="before")
    @classmethod
    def _plain_replies(cls, value: Any) -> Any:
        return [_reply_data(v) for v in value] if isinstance(value, list) else value

    @field_validator("sessions", mode="before")
    @classmethod
    def _plain_sessions(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: [_reply_data(x) for x in v] if isinstance(v, list) else v for k, v in value.items()}
        return value


class ScriptedEngine:
    """Answers from a ``Script`` or a ``policy(request) -> Reply | str | dict`` (sync or async)."""

    def __init__(self, tokenizer: ChatTokenizer, *, script: Optional[Script] = None, policy: Optional[Policy] = None,
                 model_name: str = "scripted", max_context: int = 8192, default_max_tokens: int = 4096):
        if (script is None) == (policy is None):
            raise ValueError("give exactly one of script or policy")
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_context = max_context
        self.default_max_tokens = default_max_tokens
        self._script = script
        self._policy = policy
        self._used: dict[str, int] = {}

    async def generate(self, request: ChatRequest, prompt_ids: list[int], max_tokens: int) -> Generation:
        reply = await self._next(request)
        text = reply.text()
        ids = self.tokenizer.completion_ids(text) if reply.finish_reason == "stop" else self.tokenizer.encode(text)
        finish = reply.finish_reason
        if len(ids) > max_tokens:
            ids, finish = ids[:max_tokens], "length"
            text = self.tokenizer.decode(ids)
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason=finish, text=text)

    async def aclose(self) -> None:
        return None

    async def _next(self, request: ChatRequest) -> Reply:
        if self._policy is not None:
            return await self._ask_policy(request)
        return self._from_script(request)

    async def _ask_policy(self, request: ChatRequest) -> Reply:
        answer = self._policy(request)
        if inspect.isawaitable(answer):
            answer = await answer
        if isinstance(answer, Reply):
            return answer
        try:
            return Reply.model_validate(_reply_data(answer))
        except ValidationError as e:
            raise ModelError(f"the policy returned something that is not a reply: {e}") from e

    def _from_script(self, request: ChatRequest) -> Reply:
        script = self._script
        key, replies = _session_of(script, request)
        if script.cursor == "turn":
            index = sum(1 for m in request.messages if m.role == "assistant")
        else:
            index = self._used.get(key, 0)
            self._used[key] = index + 1
        if index < len(replies):
            return replies[index]
        if script.when_done == "repeat_last" and replies:
            return replies[-1]
        where = f"session {key!r}" if key else "the script"
        raise ModelError(f"{where} has {len(replies)} replies and this is request {index + 1}")


def _session_of(script: Script, request: ChatRequest) -> tuple[str, list[Reply]]:
    if script.sessions:
        texts = [_flat(m.content) for m in request.messages]
        for marker, replies in script.sessions.items():
            if any(marker in t for t in texts):
                return marker, replies
    return "", script.replies


def _flat(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content)
    return content or ""


def _reply_data(value: Any) -> Any:
    return {"content": value} if isinstance(value, str) else value


def load_script(path: str | Path) -> Script:
    """A script from a JSON or YAML file (a list of replies, or a Script object)."""
    path = Path(path)
    try:
        raw = path.read_text()
    except OSError as e:
        raise RequestError(f"cannot read script {path}: {e}") from e
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(raw)
        else:
            data = json.loads(raw)
        return Script.model_validate({"replies": data} if isinstance(data, list) else data)
    except (ValueError, ValidationError) as e:
        raise RequestError(f"invalid script {path}: {e}") from e


def load_policy(spec: str) -> Policy:
    """A policy callable from ``package.module:function`` or ``path/to/file.py:function``."""
    module_name, _, attribute = spec.rpartition(":")
    if not module_name or not attribute:
        raise RequestError(f"policy {spec!r} must look like package.module:function or file.py:function")
    try:
        module = _import(module_name)
        policy = getattr(module, attribute)
    except (ImportError, AttributeError, OSError) as e:
        raise RequestError(f"cannot load policy {spec!r}: {e}") from e
    if not callable(policy):
        raise RequestError(f"policy {spec!r} is not callable")
    return policy


def _import(name: str) -> Any:
    if not name.endswith(".py"):
        return importlib.import_module(name)
    spec = importlib.util.spec_from_file_location(Path(name).stem, name)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {name}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
