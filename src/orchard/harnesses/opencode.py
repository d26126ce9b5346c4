"""Adapter for OpenCode (`opencode-ai` from npm), speaking OpenAI Chat Completions to the proxy.

Launch: ``opencode run --pure --auto --model orchard/MODEL --title orchard INSTRUCTION`` with
OPENCODE_CONFIG naming a JSON config that declares the provider ``orchard`` through OpenCode's
bundled ``@ai-sdk/openai-compatible`` (baseURL: the proxy's Chat Completions base; apiKey: the
session key) and caps the build agent's steps. Everything that would reach the network is off:
the models.dev catalogue, auto-update, default plugins (``--pure``), LSP downloads, sharing.
Its data, cache and state live in the run directory. Past ``steps`` OpenCode forces a text-only
answer, so a step budget ends as a finished run; the wall clock and the proxy's limits still apply.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from orchard.harnesses import tools
from orchard.harnesses.base import RUN_DIR, Budget, Endpoint, Launch, Reason, exit_outcome, tool

PACKAGE, VERSION = "opencode-ai", "1.18.33"
HOME = f"{RUN_DIR}/opencode"
QUIET = {"OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
         "OPENCODE_DISABLE_LSP_DOWNLOAD": "1", "OPENCODE_DISABLE_SHARE": "1", "OPENCODE_DISABLE_CLAUDE_CODE": "1",
         "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1", "OPENCODE_DISABLE_TERMINAL_TITLE": "1"}


class OpenCode:
    """OpenCode, `opencode run` non-interactively."""

    name = "opencode"
    dialect = "openai_chat"

    def install(self, tools_dir: Path) -> None:
        tools.install_tree(tools_dir, self.name, f"{PACKAGE}@{VERSION}", tools.npm_fill(PACKAGE, VERSION),
                           {"opencode": "node_modules/.bin/opencode"})

    def installed(self, tools_dir: Path) -> bool:
        return tools.is_installed(tools_dir, self.name, f"{PACKAGE}@{VERSION}")

    def launch(self, instruction: str, endpoint: Endpoint, budget: Budget, workdir: str) -> Launch:
        config_path = f"{HOME}/opencode.json"
        argv = [tool("opencode"), "run", "--pure", "--auto", "--model", f"orchard/{endpoint.model}",
                "--title", "orchard", "--dir", workdir, "--", instruction]
        env = {**QUIET, "OPENCODE_CONFIG": config_path, "HOME": HOME, "PWD": workdir, "XDG_CONFIG_HOME": f"{HOME}/config",
               "XDG_DATA_HOME": f"{HOME}/data", "XDG_CACHE_HOME": f"{HOME}/cache", "XDG_STATE_HOME": f"{HOME}/state",
               "NO_COLOR": "1"}
        return Launch(argv=argv, env=env, files={config_path: json.dumps(config(endpoint, budget), indent=2)}, cwd=workdir)

    def outcome(self, exit_code: Optional[int], stdout: str, stderr: str, report: str = "") -> tuple[Reason, str]:
        return exit_outcome(exit_code, stdout, stderr)


def config(endpoint: Endpoint, budget: Budget) -> dict:
    """OpenCode's config: the proxy as provider ``orchard``, one model, a step cap, nothing networked."""
    provider = {"npm": "@ai-sdk/openai-compatible", "name": "Orchard proxy",
                "options": {"baseURL": endpoint.url("openai_chat"), "apiKey": endpoint.key},
                "models": {endpoint.model: {"name": endpoint.model, "tool_call": True}}}
    return {"$schema": "https://opencode.ai/config.json", "provider": {"orchard": provider},
            "model": f"orchard/{endpoint.model}", "small_model": f"orchard/{endpoint.model}",
            "autoupdate": False, "share": "disabled", "agent": {"build": {"steps": budget.max_steps}}}
