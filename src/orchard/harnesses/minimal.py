"""Adapter for the built-in minimal harness (minimal_agent.py: a ReAct loop over one bash tool, OpenAI Chat Completions).

Install: copy minimal_agent.py into ``<tools>/minimal/`` with a wrapper that runs it under the
sandbox's python3 (standard library only). Launch: ``orchard-minimal --base-url URL --model MODEL
--max-steps N INSTRUCTION`` with the session key in ORCHARD_MODEL_KEY. Its last stdout line is a
JSON summary whose ``reason`` (done, budget, error) is the run's.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Optional

from orchard.harnesses import minimal_agent, tools
from orchard.harnesses.base import Budget, Endpoint, Launch, Reason, error_or_budget, exit_outcome, tool

SOURCE = Path(minimal_agent.__file__)
WRAPPER = f"""#!/bin/sh
# the built-in minimal harness, run by the sandbox's own python3
here=$(dirname "$(readlink -f "$0")")
exec {tools.SANDBOX_PYTHON} "$here/minimal_agent.py" "$@"
"""


class Minimal:
    """The built-in minimal harness."""

    name = "minimal"
    dialect = "openai_chat"

    def install(self, tools_dir: Path) -> None:
        tools.install_tree(tools_dir, self.name, _spec(), _fill, {"orchard-minimal": "orchard-minimal"})

    def installed(self, tools_dir: Path) -> bool:
        return tools.is_installed(tools_dir, self.name, _spec())

    def launch(self, instruction: str, endpoint: Endpoint, budget: Budget, workdir: str) -> Launch:
        argv = [tool("orchard-minimal"), "--base-url", endpoint.url("openai_chat"), "--model", endpoint.model,
                "--max-steps", str(budget.max_steps), "--", instruction]
        return Launch(argv=argv, env={"ORCHARD_MODEL_KEY": endpoint.key}, cwd=workdir)

    def outcome(self, exit_code: Optional[int], stdout: str, stderr: str, report: str = "") -> tuple[Reason, str]:
        summary = _summary(stdout)
        if exit_code == 124 or summary is None:
            return exit_outcome(exit_code, stdout, stderr)
        reason = summary.get("reason")
        if reason in ("done", "budget"):
            return reason, f"{reason} after {summary.get('steps')} steps"
        return error_or_budget(str(summary.get("error", ""))[:300], str(summary.get("error", "")))


def _spec() -> str:
    """What is installed: the agent script's content hash, so an edited script is reinstalled."""
    return "minimal-agent sha256:" + hashlib.sha256(SOURCE.read_bytes() + WRAPPER.encode()).hexdigest()[:16]


def _fill(tmp: Path) -> None:
    shutil.copyfile(SOURCE, tmp / "minimal_agent.py")
    (tmp / "orchard-minimal").write_text(WRAPPER)
    (tmp / "orchard-minimal").chmod(0o755)


def _summary(stdout: str) -> Optional[dict]:
    lines = stdout.strip().splitlines()
    try:
        value = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
