"""Adapter for mini-swe-agent (`mini-swe-agent` from PyPI), speaking OpenAI Chat Completions (through litellm) to the proxy.

Install: ``pip install --target <tools>/mini-swe-agent/lib`` for the sandbox's own python3, plus a
small wrapper that runs ``python3 -m minisweagent.run.mini`` with that tree on PYTHONPATH (so no
virtualenv and no absolute host paths). Launch: ``mini -t INSTRUCTION -y --exit-immediately -m
openai/MODEL -c mini_textbased.yaml -c model.model_class=litellm_textbased -c
model.model_kwargs.api_base=URL -c agent.step_limit=N -o trajectory.json``: the text-based format,
where each reply holds one ```mswea_bash_command block and the run ends when a command prints
COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT. The session key goes in OPENAI_API_KEY. litellm uses its
bundled cost map (no download), the first-run setup wizard is skipped, cost tracking errors for an
unknown model are ignored. The trajectory's ``info.exit_status`` says how the run ended.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from orchard.harnesses import tools
from orchard.harnesses.base import RUN_DIR, Budget, Endpoint, Launch, Reason, error_or_budget, exit_outcome, tool

REQUIREMENT = "mini-swe-agent==2.4.6"
HOME = f"{RUN_DIR}/mini-swe-agent"
WRAPPER = f"""#!/bin/sh
# mini-swe-agent from the tools folder, run by the sandbox's own python3 (no virtualenv, no host paths)
here=$(dirname "$(readlink -f "$0")")
PYTHONPATH="$here/lib${{PYTHONPATH:+:$PYTHONPATH}}" exec {tools.SANDBOX_PYTHON} -m minisweagent.run.mini "$@"
"""
QUIET = {"MSWEA_CONFIGURED": "1", "MSWEA_SILENT_STARTUP": "1", "MSWEA_COST_TRACKING": "ignore_errors",
         "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
         "LITELLM_TELEMETRY": "False", "HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
DONE, BUDGET = ("Submitted",), ("LimitsExceeded", "TimeExceeded")


class MiniSweAgent:
    """mini-swe-agent's `mini` command, text-based actions, no confirmations."""

    name = "mini-swe-agent"
    dialect = "openai_chat"

    def install(self, tools_dir: Path) -> None:
        tools.install_tree(tools_dir, self.name, REQUIREMENT, _fill, {"mini": "orchard-mini"})

    def installed(self, tools_dir: Path) -> bool:
        return tools.is_installed(tools_dir, self.name, REQUIREMENT)

    def launch(self, instruction: str, endpoint: Endpoint, budget: Budget, workdir: str) -> Launch:
        report = f"{HOME}/trajectory.json"
        argv = [tool("mini"), "-t", instruction, "-y", "--exit-immediately", "-m", f"openai/{endpoint.model}",
                "-c", "mini_textbased.yaml", "-c", "model.model_class=litellm_textbased",
                "-c", f"model.model_kwargs.api_base={endpoint.url('openai_chat')}",
                "-c", f"agent.step_limit={budget.max_steps}", "-c", "agent.cost_limit=0", "-o", report]
        env = {**QUIET, "OPENAI_API_KEY": endpoint.key, "MSWEA_GLOBAL_CONFIG_DIR": HOME, "HOME": HOME}
        return Launch(argv=argv, env=env, cwd=workdir, report_file=report)

    def outcome(self, exit_code: Optional[int], stdout: str, stderr: str, report: str = "") -> tuple[Reason, str]:
        status = _exit_status(report)
        if exit_code == 124 or not status:
            return exit_outcome(exit_code, stdout, stderr)
        if status in DONE:
            return "done", "submitted"
        if status in BUDGET:
            return "budget", status
        return error_or_budget(f"{status}: {_exception(report)[:300]}", _exception(report))


def _fill(tmp: Path) -> None:
    tools.pip_fill(REQUIREMENT)(tmp / "lib")
    (tmp / "orchard-mini").write_text(WRAPPER)
    (tmp / "orchard-mini").chmod(0o755)


def _info(report: str) -> dict:
    try:
        data = json.loads(report) if report else {}
    except ValueError:
        return {}
    return data.get("info") or {} if isinstance(data, dict) else {}


def _exit_status(report: str) -> str:
    return str(_info(report).get("exit_status") or "")


def _exception(report: str) -> str:
    try:
        last = (json.loads(report).get("messages") or [{}])[-1]
    except (ValueError, AttributeError):
        return ""
    return str((last.get("extra") or {}).get("exception_str") or last.get("content") or "")
