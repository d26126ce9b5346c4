"""Running one harness in a sandbox against a proxy session: write its files, run its command, judge the end.

``run_harness`` (SandboxClient) and ``arun_harness`` (AsyncSandboxClient) are twins: only the lines
that talk to the sandbox differ; what to run and how to judge it are shared.
"""

from __future__ import annotations

import shlex
import time
from typing import Any, Optional, Union

from orchard import errors
from orchard.harnesses.base import Budget, Endpoint, Harness, HarnessResult, Launch, tail

NOT_STARTED = (126, 127)   # the shell could not find or run the harness's command


def resolve(harness: Union[str, Harness]) -> Harness:
    """An adapter from its name, or the adapter itself."""
    if isinstance(harness, str):
        from orchard.harnesses import get_harness
        return get_harness(harness)
    return harness


def prepare_command(launch: Launch) -> list[str]:
    """Make the harness's directories and check its command exists before running it."""
    dirs = sorted({launch.cwd, *(v for k, v in launch.env.items() if k == "HOME")})
    script = 'mkdir -p "$@" && test -x "$0" || { echo "harness command $0 is not there (is the tools folder mounted?)" >&2; exit 127; }'
    return ["sh", "-c", script, launch.argv[0], *dirs]


def check_prepared(harness: Harness, result: Any) -> None:
    """HarnessError when the harness cannot even start (not installed, tools folder not mounted)."""
    if result.exit_code != 0:
        raise errors.HarnessError(
            f"{harness.name} cannot start: {tail(result.stderr or result.error or '', 500).strip()} "
            "(run `orchard harness install` and start the service with ORCHARD_TOOLS_DIR)")


def judge(harness: Harness, launch: Launch, result: Any, report: str, seconds: float) -> HarnessResult:
    """The typed result of a finished run; HarnessError if the harness never started."""
    exit_code = result.exit_code if result.exit_code is not None else (124 if "timed out" in (result.error or "") else None)
    if exit_code in NOT_STARTED:
        raise errors.HarnessError(f"{harness.name} could not start (exit {exit_code}): {tail(result.stderr, 500).strip()}")
    reason, detail = harness.outcome(exit_code, result.stdout or "", result.stderr or "", report)
    return HarnessResult(harness=harness.name, reason=reason, exit_code=exit_code, detail=detail,
                         stdout_tail=tail(result.stdout or ""), stderr_tail=tail(result.stderr or ""),
                         seconds=round(seconds, 3))


def plan(harness: Union[str, Harness], endpoint: Endpoint, instruction: str, budget: Optional[Budget],
         workdir: str) -> tuple[Harness, Launch, Budget]:
    """The adapter, its launch and the budget for one run."""
    if not instruction.strip():
        raise errors.RequestError("the instruction is empty")
    adapter = resolve(harness)
    budget = budget or Budget()
    return adapter, adapter.launch(instruction, endpoint, budget, workdir), budget


def run_harness(client: Any, sandbox: Any, harness: Union[str, Harness], session: Endpoint, instruction: str,
                budget: Optional[Budget] = None, workdir: str = "/workspace") -> HarnessResult:
    """Run ``harness`` once in ``sandbox`` (a SandboxInstance or its id) on ``instruction`` through ``session``."""
    box = client.get_sandbox(sandbox) if isinstance(sandbox, str) else sandbox
    adapter, launch, budget = plan(harness, session, instruction, budget, workdir)
    check_prepared(adapter, box.exec(prepare_command(launch), timeout=60))
    for path, text in launch.files.items():
        box.upload_content(text, path)
    started = time.monotonic()
    result = box.exec(launch.argv, timeout=budget.timeout_s, cwd=launch.cwd, env=launch.env)
    seconds = time.monotonic() - started
    return judge(adapter, launch, result, _read_report(box, launch), seconds)


async def arun_harness(client: Any, sandbox: Any, harness: Union[str, Harness], session: Endpoint, instruction: str,
                       budget: Optional[Budget] = None, workdir: str = "/workspace") -> HarnessResult:
    """The async twin of run_harness (AsyncSandboxClient and its sandbox handles)."""
    box = (await client.get_sandbox(sandbox)) if isinstance(sandbox, str) else sandbox
    adapter, launch, budget = plan(harness, session, instruction, budget, workdir)
    check_prepared(adapter, await box.exec(prepare_command(launch), timeout=60))
    for path, text in launch.files.items():
        await box.upload_content(text, path)
    started = time.monotonic()
    result = await box.exec(launch.argv, timeout=budget.timeout_s, cwd=launch.cwd, env=launch.env)
    seconds = time.monotonic() - started
    report = ""
    if launch.report_file:
        try:
            report = (await box.download_content(launch.report_file)).decode(errors="replace")
        except errors.NotFoundError:
            pass
    return judge(adapter, launch, result, report, seconds)


def _read_report(box: Any, launch: Launch) -> str:
    if not launch.report_file:
        return ""
    try:
        return box.download_content(launch.report_file).decode(errors="replace")
    except errors.NotFoundError:
        return ""


def command_line(launch: Launch) -> str:
    """The launch as one shell line (for logs and people)."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(launch.env.items()) if "KEY" not in k)
    return f"cd {shlex.quote(launch.cwd)} && {env} {shlex.join(launch.argv)}".strip()
