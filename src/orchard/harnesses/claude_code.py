"""Adapter for Anthropic's Claude Code (`@anthropic-ai/claude-code` from npm), speaking Anthropic Messages to the proxy.

Launch: ``claude -p INSTRUCTION --dangerously-skip-permissions --model MODEL --max-turns N
--output-format json`` with ANTHROPIC_BASE_URL (the proxy's Messages base, no /v1) and
ANTHROPIC_API_KEY (the session key). Claude Code refuses to skip permissions as root unless
IS_SANDBOX=1 says it is sandboxed, which an Orchard sandbox is (no capabilities, no network but the
model port). Every side model (the "small fast" one for titles and summaries) is pointed at the same
model name, so all calls go to the one proxy session. Telemetry, error reports, the auto-updater and
other non-essential traffic are off. The run's JSON result says how it ended (``subtype``:
``success``, ``error_max_turns``, ``error_during_execution``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from orchard.harnesses import tools
from orchard.harnesses.base import RUN_DIR, Budget, Endpoint, Launch, Reason, error_or_budget, exit_outcome, tool

PACKAGE, VERSION = "@anthropic-ai/claude-code", "2.1.332"
HOME = f"{RUN_DIR}/claude"
QUIET = {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_UPDATES": "1",
         "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1", "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
         "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1", "CLAUDE_CODE_DISABLE_FEATURE_FLAGS": "1"}


class ClaudeCode:
    """Claude Code in print mode (`claude -p`)."""

    name = "claude-code"
    dialect = "anthropic_messages"

    def install(self, tools_dir: Path) -> None:
        tools.install_tree(tools_dir, self.name, f"{PACKAGE}@{VERSION}", tools.npm_fill(PACKAGE, VERSION),
                           {"claude": "node_modules/.bin/claude"})

    def installed(self, tools_dir: Path) -> bool:
        return tools.is_installed(tools_dir, self.name, f"{PACKAGE}@{VERSION}")

    def launch(self, instruction: str, endpoint: Endpoint, budget: Budget, workdir: str) -> Launch:
        argv = [tool("claude"), "-p", instruction, "--dangerously-skip-permissions", "--model", endpoint.model,
                "--max-turns", str(budget.max_steps), "--output-format", "json"]
        env = {**QUIET, "ANTHROPIC_BASE_URL": endpoint.url("anthropic_messages"), "ANTHROPIC_API_KEY": endpoint.key,
               "ANTHROPIC_SMALL_FAST_MODEL": endpoint.model, "ANTHROPIC_DEFAULT_HAIKU_MODEL": endpoint.model,
               "ANTHROPIC_DEFAULT_SONNET_MODEL": endpoint.model, "ANTHROPIC_DEFAULT_OPUS_MODEL": endpoint.model,
               "CLAUDE_CODE_SUBAGENT_MODEL": endpoint.model, "CLAUDE_CODE_MAX_RETRIES": "0",
               "IS_SANDBOX": "1", "CLAUDE_CONFIG_DIR": f"{HOME}/config", "HOME": HOME}
        return Launch(argv=argv, env=env, cwd=workdir)

    def outcome(self, exit_code: Optional[int], stdout: str, stderr: str, report: str = "") -> tuple[Reason, str]:
        result = _result(stdout)
        if exit_code != 124 and result is not None:
            subtype = str(result.get("subtype", ""))
            if subtype == "error_max_turns":
                return "budget", "stopped at --max-turns"
            if subtype == "success" and not result.get("is_error"):
                return "done", f"finished in {result.get('num_turns', '?')} turns"
            return error_or_budget(f"{subtype}: {str(result.get('result', ''))[:300]}", str(result.get("result", "")))
        return exit_outcome(exit_code, stdout, stderr)


def _result(stdout: str) -> Optional[dict]:
    """The JSON result object Claude Code prints last in --output-format json."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and value.get("type") == "result":
            return value
    return None
