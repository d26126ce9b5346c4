"""Adapter for OpenAI's Codex CLI (`@openai/codex` from npm), speaking OpenAI Responses to the proxy.

Launch: ``codex exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox -m MODEL
-c model_provider=orchard -c model_providers.orchard={base_url=..., env_key=ORCHARD_MODEL_KEY,
wire_api="responses", ...} INSTRUCTION`` with CODEX_HOME in the run directory.

Codex's own sandbox (landlock + seccomp around each command) is switched off: inside an Orchard
sandbox the harness already runs with no capabilities, no network but the model port, its own
mount, pid and network namespaces, a seccomp filter and cgroup limits, and the only thing Codex's
sandbox would add is a second, nested one that needs kernel features (landlock, user namespaces)
our seccomp filter refuses. The approval prompts go too: nobody is there to answer them.
Codex has no step limit of its own; the budget is the wall-clock timeout and the proxy session's
call and token limits, which answer with a 4xx that Codex does not retry.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from orchard.harnesses import tools
from orchard.harnesses.base import RUN_DIR, Budget, Endpoint, Launch, Reason, exit_outcome, tool

PACKAGE, VERSION = "@openai/codex", "0.171.0"
HOME = f"{RUN_DIR}/codex"


class Codex:
    """Codex CLI, `codex exec` non-interactively."""

    name = "codex"
    dialect = "openai_responses"

    def install(self, tools_dir: Path) -> None:
        tools.install_tree(tools_dir, self.name, f"{PACKAGE}@{VERSION}", tools.npm_fill(PACKAGE, VERSION),
                           {"codex": "node_modules/.bin/codex"})

    def installed(self, tools_dir: Path) -> bool:
        return tools.is_installed(tools_dir, self.name, f"{PACKAGE}@{VERSION}")

    def launch(self, instruction: str, endpoint: Endpoint, budget: Budget, workdir: str) -> Launch:
        provider = {"name": "orchard", "base_url": endpoint.url("openai_responses"), "env_key": "ORCHARD_MODEL_KEY",
                    "wire_api": "responses", "request_max_retries": 0, "stream_max_retries": 0}
        argv = [tool("codex"), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
                "--color", "never", "-C", workdir, "-m", endpoint.model,
                "-c", "model_provider=orchard", "-c", f"model_providers.orchard={_toml_inline(provider)}",
                "-c", "analytics.enabled=false", "-c", "check_for_update_on_startup=false",
                "-c", "shell_environment_policy.inherit=all", "--", instruction]
        env = {"CODEX_HOME": HOME, "ORCHARD_MODEL_KEY": endpoint.key, "HOME": HOME, "NO_COLOR": "1"}
        return Launch(argv=argv, env=env, cwd=workdir)

    def outcome(self, exit_code: Optional[int], stdout: str, stderr: str, report: str = "") -> tuple[Reason, str]:
        return exit_outcome(exit_code, stdout, stderr)


def _toml_inline(table: dict) -> str:
    """A TOML inline table (JSON strings are valid TOML basic strings)."""
    items = []
    for key, value in table.items():
        text = ("true" if value else "false") if isinstance(value, bool) else json.dumps(value)
        items.append(f"{key} = {text}")
    return "{" + ", ".join(items) + "}"
