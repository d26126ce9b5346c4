"""The built-in minimal harness: a ReAct loop over one bash tool, Python standard library only.

It runs inside a sandbox (copied into the tools folder, started with the host's python3):

    python3 minimal_agent.py --base-url http://127.0.0.1:8000/v1 --model M --max-steps 30 "instruction"

with the API key in ORCHARD_MODEL_KEY. Each step sends the whole conversation to an OpenAI Chat
Completions endpoint with one tool, ``bash``; every tool call runs as ``bash -c`` in the working
directory and its output goes back as a tool message. The run ends when the model answers without
calling a tool (that answer is its submission), or when the step budget is spent.
The last line on stdout is a JSON summary: {"reason": "done" | "budget" | "error", "steps": N, ...}.
Exit codes: 0 done, 3 budget, 1 error, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

SYSTEM = ("You are an agent working in a Linux sandbox. Use the bash tool to inspect and change files. "
          "When the task is complete, reply with a short summary and no tool call: that ends the run.")
BASH_TOOL = {"type": "function", "function": {
    "name": "bash",
    "description": "Run a bash command in the working directory; returns its exit code and output.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string", "description": "The command."}},
                   "required": ["command"]}}}
OUTPUT_LIMIT = 10000


class ModelFailure(Exception):
    """The model endpoint failed or answered something unusable."""


def chat(base_url: str, key: str, model: str, messages: list, timeout: float) -> dict:
    """One Chat Completions call; the assistant message it returns."""
    body = json.dumps({"model": model, "messages": messages, "tools": [BASH_TOOL]}).encode()
    request = urllib.request.Request(base_url.rstrip("/") + "/chat/completions", data=body, method="POST", headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            data = json.loads(reply.read())
    except urllib.error.HTTPError as e:
        raise ModelFailure(f"HTTP {e.code}: {e.read()[:500].decode(errors='replace')}") from e
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise ModelFailure(f"{type(e).__name__}: {e}") from e
    try:
        return data["choices"][0]["message"]
    except (KeyError, IndexError, TypeError) as e:
        raise ModelFailure(f"no choices in the reply: {str(data)[:300]}") from e


def run_bash(arguments: str, timeout: float) -> str:
    """Run one tool call's command; what the model sees back."""
    try:
        command = json.loads(arguments or "{}")["command"]
    except (ValueError, KeyError, TypeError):
        return 'error: the arguments must be a JSON object with a string "command"'
    try:
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=timeout, errors="replace")
    except subprocess.TimeoutExpired:
        return f"error: the command timed out after {timeout:g}s"
    output = (done.stdout + done.stderr)[-OUTPUT_LIMIT:]
    return f"exit code: {done.returncode}\n{output}"


def step(args: argparse.Namespace, key: str, messages: list) -> bool:
    """Ask the model once and act on its reply; True when it finished (answered without a tool call)."""
    message = chat(args.base_url, key, args.model, messages, args.model_timeout)
    calls = message.get("tool_calls") or []
    messages.append({"role": "assistant", "content": message.get("content"), **({"tool_calls": calls} if calls else {})})
    for call in calls:
        function = call.get("function") or {}
        if function.get("name") == "bash":
            result = run_bash(function.get("arguments", ""), args.command_timeout)
        else:
            result = f"error: unknown tool {function.get('name')!r}; the only tool is bash"
        messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": result})
    return not calls


def run(args: argparse.Namespace, key: str) -> dict:
    """The loop: steps until the model finishes or the budget is spent."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": args.instruction}]
    for n in range(1, args.max_steps + 1):
        try:
            if step(args, key, messages):
                return {"reason": "done", "steps": n, "submission": messages[-1]["content"] or ""}
        except ModelFailure as e:
            return {"reason": "error", "steps": n, "error": str(e)}
    return {"reason": "budget", "steps": args.max_steps}


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description="A ReAct loop over one bash tool (OpenAI Chat Completions).")
    parser.add_argument("instruction")
    parser.add_argument("--base-url", required=True, help="OpenAI-compatible base URL ending in /v1")
    parser.add_argument("--model", default="orchard")
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--command-timeout", type=float, default=120.0)
    parser.add_argument("--model-timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    if args.max_steps < 1:
        parser.error("--max-steps must be at least 1")
    summary = run(args, os.environ.get("ORCHARD_MODEL_KEY", ""))
    print(json.dumps(summary))
    return {"done": 0, "budget": 3}.get(summary["reason"], 1)


if __name__ == "__main__":
    sys.exit(main())
