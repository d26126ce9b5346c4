"""A scripted model for harness tests: create /workspace/hello.txt with the harness's own shell tool, then finish.

It reads what each request offers: a shell-like tool (bash, Bash, exec_command, shell) gets one call
whose arguments follow that tool's schema; mini-swe-agent's text format (no tools, ```mswea_bash_command
blocks) gets the command in a block, then the submit command; a request with no tool (titles, summaries)
gets a short line of text. Once a call has been made in the conversation, the answer is a final message.
Every reply is kept, so a test can check the recorded calls against exactly what this model produced.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from orchard.inference.api import ChatRequest
from orchard.inference.scripted import Reply, ScriptedCall

COMMAND = "echo hello > /workspace/hello.txt"
SHELL_TOOLS = ("bash", "Bash", "exec_command", "shell", "local_shell")
MINI_MARKER = "mswea_bash_command"
FINAL = "Created /workspace/hello.txt containing hello."


class HelloPolicy:
    """``policy(request) -> Reply`` for the scripted engine; ``replies`` holds every reply given."""

    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.requests: list[ChatRequest] = []
        self._lock = threading.Lock()

    def reset(self) -> None:
        with self._lock:
            self.replies, self.requests = [], []

    def __call__(self, request: ChatRequest) -> Reply:
        reply = self._answer(request)
        with self._lock:
            self.requests.append(request)
            self.replies.append(reply)
        return reply

    def _answer(self, request: ChatRequest) -> Reply:
        if any(MINI_MARKER in _text(m.content) for m in request.messages if m.role == "system"):
            return _mini_turn(request)
        tool = _shell_tool(request)
        if tool is None:
            return Reply(content="Create hello.txt")
        if _already_called(request):
            return Reply(content=FINAL)
        return Reply(content="I will create the file.", tool_calls=[ScriptedCall(name=tool["name"], arguments=_arguments(tool))])


def _text(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return content or ""


def _shell_tool(request: ChatRequest) -> Optional[dict]:
    offered = {t.function.name: t.function for t in request.tools or []}
    for name in SHELL_TOOLS:
        if name in offered:
            return {"name": name, "parameters": offered[name].parameters or {}}
    return None


def _already_called(request: ChatRequest) -> bool:
    return any(m.role == "tool" or (m.role == "assistant" and m.tool_calls) for m in request.messages)


def _arguments(tool: dict) -> dict:
    """Arguments for the shell tool, shaped by its schema: the command as a string or an argv array."""
    properties = tool["parameters"].get("properties", {})
    key = next((k for k in ("command", "cmd") if k in properties), "command")
    value: Any = ["bash", "-lc", COMMAND] if properties.get(key, {}).get("type") == "array" else COMMAND
    arguments = {key: value}
    if "description" in tool["parameters"].get("required", []):
        arguments["description"] = "Create hello.txt"
    return arguments


def _mini_turn(request: ChatRequest) -> Reply:
    observed = any("<returncode>" in _text(m.content) for m in request.messages if m.role == "user")
    command = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" if observed else COMMAND
    return Reply(content=f"THOUGHT: {'The file is there; submit.' if observed else 'Create the file.'}\n\n"
                         f"```{MINI_MARKER}\n{command}\n```")
