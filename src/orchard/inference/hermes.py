"""The Hermes tool-call format: how tool calls look in a model's raw text, rendered and parsed.

One block per call, after any plain text::

    <tool_call>
    {"name": "bash", "arguments": {"command": "ls"}}
    </tool_call>

Parsing is lenient about whitespace around the JSON and strict about the JSON itself: a block that is not a
JSON object with a string ``name`` stays in the text (it is not a tool call).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ParsedCall:
    """One tool call found in the text: its name and its arguments as a JSON string."""

    name: str
    arguments: str


def arguments_json(arguments: Any) -> str:
    """Canonical JSON text of a call's arguments (a dict, or a JSON string of one)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return arguments
    return json.dumps(arguments, ensure_ascii=False)


def render_call(name: str, arguments: Any) -> str:
    """One call as a Hermes block."""
    body = arguments_json(arguments)
    return f'{OPEN}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {body}}}\n{CLOSE}'


def render_turn(content: str | None, calls: list[tuple[str, Any]]) -> str:
    """An assistant turn's raw text: the content, then one block per call, separated by newlines."""
    parts = [content] if content else []
    parts += [render_call(name, arguments) for name, arguments in calls]
    return "\n".join(parts)


def parse(text: str) -> tuple[str | None, list[ParsedCall]]:
    """Split raw text into (content outside the calls, or None when empty; the calls)."""
    calls: list[ParsedCall] = []
    kept: list[str] = []
    position = 0
    for match in _BLOCK.finditer(text):
        call = _parse_block(match.group(1))
        if call is None:
            continue
        kept.append(text[position:match.start()])
        position = match.end()
        calls.append(call)
    kept.append(text[position:])
    content = "".join(kept).strip() if calls else text
    return (content or None), calls


def _parse_block(body: str) -> ParsedCall | None:
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        return ParsedCall(data["name"], arguments)
    return ParsedCall(data["name"], json.dumps(arguments, ensure_ascii=False))
