"""Adapter for OpenAI's Codex CLI (`@openai/codex` from npm), speaking OpenAI Responses to the proxy.

Launch: ``codex exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox -C WORKDIR
INSTRUCTION`` with CODEX_HOME in the run directory, whose config.toml declares the only model provider,
``orchard`` (base_url: the proxy's Responses base; env_key: ORCHARD_MODEL_KEY, holding the session key;
wire_api "responses"; no retries), and switches off analytics and the update check.

Codex's own sandbox is switched off. That is safe here: inside an Orchard sandbox the harness already
runs with no capabilities, no network but the model port, its own mount, pid and network namespaces,
a seccomp filter and cgroup limits. It is also necessary: with ``--sandbox workspace-write`` Codex runs
each command under bubblewrap, which cannot make namespaces inside ours ("bwrap: No permissions to
create new namespace"), so every command fails. The approval prompts go too: nobody would answer them.
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
        argv = [tool("codex"), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
                "--color", "never", "-C", workdir, "--", instruction]
        env = {"CODEX_HOME": HOME, "ORCHARD_MODEL_KEY": endpoint.key, "HOME": HOME, "NO_COLOR": "1"}
        return Launch(argv=argv, env=env, files={f"{HOME}/config.toml": config(endpoint)}, cwd=workdir)

    def outcome(self, exit_code: Optional[int], stdout: str, stderr: str, report: str = "") -> tuple[Reason, str]:
        return exit_outcome(exit_code, stdout, stderr)


def config(endpoint: Endpoint) -> str:
    """$CODEX_HOME/config.toml: the proxy as the only model provider (Responses API), no retries, nothing networked."""
    provider = {"name": "orchard", "base_url": endpoint.url("openai_responses"), "env_key": "ORCHARD_MODEL_KEY",
                "wire_api": "responses", "request_max_retries": 0, "stream_max_retries": 0}
    return "\n".join([
        f"model = {json.dumps(endpoint.model)}", 'model_provider = "orchard"', "check_for_update_on_startup = false",
        "[analytics]", "enabled = false",
        "[shell_environment_policy]", 'inherit = "all"',
        "[model_providers.orchard]", *(f"{k} = {_toml(v)}" for k, v in provider.items()), ""])


def _toml(value: object) -> str:
    """A TOML scalar (JSON strings and integers are valid TOML)."""
    return ("true" if value else "false") if isinstance(value, bool) else json.dumps(value)
