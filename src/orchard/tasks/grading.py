"""Run a task in Orchard Env: start its sandbox, set it up, and grade a final state or a patch.

Sync functions take a `SandboxClient` / `SandboxInstance`; the `a`-prefixed twins take the async SDK.
Both build their commands with the same I/O-free helpers, so they cannot drift.
"""

from __future__ import annotations

import asyncio
import shlex
import threading
import time
from typing import Any, Optional

from orchard import errors
from orchard.tasks import judge as jg
from orchard.tasks import outcomes as oc
from orchard.tasks.images import abuild_image, build_image, is_buildable
from orchard.tasks.model import AnyTask, CheckerScoring, JudgeScoring, TestsScoring

SETUP_DIR = "/tmp/.orchard_setup"
CHECKER_PATH = f"{oc.REPORT_DIR}/checker.sh"
PATCH_PATH = f"{oc.REPORT_DIR}/submitted.diff"
# One image build at a time per image in this process (a missing image is built by the first caller).
_THREAD_LOCKS: dict[str, threading.Lock] = {}
_ASYNC_LOCKS: dict[tuple[int, str], asyncio.Lock] = {}


# ------------------------------------------------------------ commands (no I/O)
def apply_command(path: str) -> str:
    """git apply, falling back to patch(1) with fuzz the way SWE-bench's harness does."""
    q = shlex.quote(path)
    return f"git apply --whitespace=nowarn {q} || patch --batch --fuzz=5 -p1 -i {q}"


def test_command(scoring: TestsScoring) -> str:
    """The task's test command with the report plugin loaded (pytest-json) or as is (pytest-ra)."""
    if scoring.parser == "pytest-ra":
        return scoring.command
    return (f"export PYTHONPATH={oc.REPORT_DIR}${{PYTHONPATH:+:$PYTHONPATH}} "
            f"PYTEST_ADDOPTS='-p {oc.REPORT_PLUGIN}' ORCHARD_PYTEST_REPORT={oc.REPORT_FILE}; "
            f"rm -f {oc.REPORT_FILE}; {scoring.command}")


def grading_files(task: AnyTask) -> dict[str, str]:
    """Files the grader uploads just before scoring (never visible to the agent before that)."""
    if isinstance(task.scoring, CheckerScoring):
        return {CHECKER_PATH: task.scoring.script}
    if isinstance(task.scoring, TestsScoring) and task.scoring.parser == "pytest-json":
        return {f"{oc.REPORT_DIR}/{oc.REPORT_PLUGIN}.py": oc.PLUGIN_SOURCE}
    return {}


def scoring_command(task: AnyTask) -> tuple[str, float]:
    """The one command that scores the sandbox's current state, and its timeout."""
    scoring = task.scoring
    if isinstance(scoring, CheckerScoring):
        return f"bash {CHECKER_PATH}", scoring.timeout
    if isinstance(scoring, TestsScoring):
        return test_command(scoring), scoring.timeout
    raise errors.TaskError(f"task {task.id}: judge scoring is done by a judge model, not in a sandbox")


def result_from(task: AnyTask, exit_code: Optional[int], output: str, report: str, started: float,
                patch_applied: Optional[bool] = None) -> oc.GradeResult:
    """The typed result of one scoring command's output."""
    base = dict(task_id=task.id, kind=task.scoring.kind, exit_code=exit_code, output=oc.tail(output),
                patch_applied=patch_applied, seconds=round(time.monotonic() - started, 3))
    if isinstance(task.scoring, CheckerScoring):
        status = "resolved" if exit_code == 0 else "unresolved"
        return oc.GradeResult(status=status, reward=float(status == "resolved"), **base)
    scoring = task.scoring
    found = oc.parse_report(report) if scoring.parser == "pytest-json" else oc.parse_ra(output)
    status, f2p, p2p = oc.judge_tests(scoring.fail_to_pass, scoring.pass_to_pass, found)
    return oc.GradeResult(status=status, reward=float(status == "resolved"), fail_to_pass=f2p, pass_to_pass=p2p,
                          **base)


def unapplied(task: AnyTask, output: str, started: float) -> oc.GradeResult:
    """A patch that does not apply is the model's failure: unresolved, reward 0."""
    return oc.GradeResult(task_id=task.id, status="unresolved", reward=0.0, kind=task.scoring.kind,
                          patch_applied=False, output=oc.tail(output), seconds=round(time.monotonic() - started, 3))


def infra_error(task: AnyTask, error: BaseException, started: float) -> oc.GradeResult:
    """The grader could not run: recorded as an error, never as a model failure."""
    return oc.GradeResult(task_id=task.id, status="error", reward=None, kind=task.scoring.kind,
                          error=f"{type(error).__name__}: {error}", seconds=round(time.monotonic() - started, 3))


def setup_failure(task: AnyTask, command: str, result: Any) -> errors.TaskError:
    return errors.TaskError(f"task {task.id}: setup command failed (exit {result.exit_code}): {command}\n"
                            f"{oc.tail(result.stdout + result.stderr, 2000)}")


def _missing_image(e: errors.OrchardError) -> bool:
    return isinstance(e, (errors.SandboxFailedError, errors.NotFoundError)) and "snapshots" in str(e.detail)


# ------------------------------------------------------------ sync
def create_task_sandbox(client: Any, task: AnyTask, **create_kwargs: Any) -> Any:
    """A fresh sandbox from the task's image (built first when it is a known, missing task image)."""
    try:
        return client.create_sandbox(task.image, **create_kwargs)
    except errors.OrchardError as e:
        if not (_missing_image(e) and is_buildable(task.image)):
            raise
    with _THREAD_LOCKS.setdefault(task.image, threading.Lock()):     # many rollouts, one build
        try:
            return client.create_sandbox(task.image, **create_kwargs)
        except errors.OrchardError as e:
            if not _missing_image(e):
                raise
        build_image(client, task.image)
    return client.create_sandbox(task.image, **create_kwargs)


def setup_sandbox(sandbox: Any, task: AnyTask) -> None:
    """Write the setup files and run the setup commands; TaskError when one fails."""
    for path, content in task.setup.files.items():
        sandbox.upload_content(content, path)
    for command in task.setup.commands:
        result = sandbox.exec(command, timeout=task.setup.timeout, cwd=task.setup.workdir)
        if result.exit_code != 0:
            raise setup_failure(task, command, result)


def prepare_sandbox(client: Any, task: AnyTask, **create_kwargs: Any) -> Any:
    """A sandbox ready for the agent: created from the task image and set up (deleted if setup fails)."""
    sandbox = create_task_sandbox(client, task, **create_kwargs)
    try:
        setup_sandbox(sandbox, task)
    except BaseException:
        sandbox.delete()
        raise
    return sandbox


def collect_patch(sandbox: Any, task: AnyTask) -> str:
    """The agent's changes as a unified diff against the task's starting commit (new files included)."""
    result = sandbox.exec("git add -A >/dev/null 2>&1; git diff --cached --binary HEAD", timeout=120,
                          cwd=task.setup.workdir)
    if result.exit_code != 0:
        raise errors.TaskError(f"task {task.id}: git diff failed: {oc.tail(result.stderr, 500)}")
    return result.stdout


def grade_sandbox(sandbox: Any, task: AnyTask, patch_applied: Optional[bool] = None,
                  **judge: Any) -> oc.GradeResult:
    """Score the sandbox's current state in place (terminal tasks: the agent's own sandbox).

    Judge scoring asks the judge model (``judge``: url / model / api_key overrides, see tasks/judge.py).
    """
    if isinstance(task.scoring, JudgeScoring):
        return jg.grade_judge(sandbox, task, patch_applied=patch_applied, **judge)
    started = time.monotonic()
    for path, content in grading_files(task).items():
        sandbox.upload_content(content, path)
    command, timeout = scoring_command(task)
    result = sandbox.exec(command, timeout=timeout + 30, cwd=task.setup.workdir)
    report = _read_report(sandbox, task)
    return result_from(task, result.exit_code, result.stdout + result.stderr, report, started, patch_applied)


def _read_report(sandbox: Any, task: AnyTask) -> str:
    if not (isinstance(task.scoring, TestsScoring) and task.scoring.parser == "pytest-json"):
        return ""
    return sandbox.exec(f"cat {oc.REPORT_FILE} 2>/dev/null", timeout=60).stdout


def apply_in(sandbox: Any, task: AnyTask, patch: str) -> tuple[bool, str]:
    """Apply a diff at the task's workdir; (applied, output)."""
    if not patch.strip():
        return True, ""
    sandbox.upload_content(patch if patch.endswith("\n") else patch + "\n", PATCH_PATH)
    result = sandbox.exec(apply_command(PATCH_PATH), timeout=120, cwd=task.setup.workdir)
    return result.exit_code == 0, result.stdout + result.stderr


def grade_patch(client: Any, task: AnyTask, patch: str, **create_kwargs: Any) -> oc.GradeResult:
    """Grade a submitted patch in a fresh sandbox: setup, test_patch, the patch, then the task's scoring."""
    started = time.monotonic()
    try:
        with prepare_sandbox(client, task, **create_kwargs) as sandbox:
            return _grade_in(sandbox, task, patch, started)
    except errors.OrchardError as e:
        return infra_error(task, e, started)


def _grade_in(sandbox: Any, task: AnyTask, patch: str, started: float) -> oc.GradeResult:
    applied, output = apply_in(sandbox, task, getattr(task, "test_patch", ""))
    if not applied:
        raise errors.TaskError(f"task {task.id}: its test_patch does not apply: {oc.tail(output, 500)}")
    applied, output = apply_in(sandbox, task, patch)
    if not applied:
        return unapplied(task, output, started)
    result = grade_sandbox(sandbox, task, patch_applied=True)
    result.seconds = round(time.monotonic() - started, 3)
    return result


# ------------------------------------------------------------ async twins
async def acreate_task_sandbox(client: Any, task: AnyTask, **create_kwargs: Any) -> Any:
    """Async twin of create_task_sandbox."""
    try:
        return await client.create_sandbox(task.image, **create_kwargs)
    except errors.OrchardError as e:
        if not (_missing_image(e) and is_buildable(task.image)):
            raise
    key = (id(asyncio.get_running_loop()), task.image)
    async with _ASYNC_LOCKS.setdefault(key, asyncio.Lock()):          # many rollouts, one build
        try:
            return await client.create_sandbox(task.image, **create_kwargs)
        except errors.OrchardError as e:
            if not _missing_image(e):
                raise
        await abuild_image(client, task.image)
    return await client.create_sandbox(task.image, **create_kwargs)


async def asetup_sandbox(sandbox: Any, task: AnyTask) -> None:
    """Async twin of setup_sandbox."""
    for path, content in task.setup.files.items():
        await sandbox.upload_content(content, path)
    for command in task.setup.commands:
        result = await sandbox.exec(command, timeout=task.setup.timeout, cwd=task.setup.workdir)
        if result.exit_code != 0:
            raise setup_failure(task, command, result)


async def aprepare_sandbox(client: Any, task: AnyTask, **create_kwargs: Any) -> Any:
    """Async twin of prepare_sandbox."""
    sandbox = await acreate_task_sandbox(client, task, **create_kwargs)
    try:
        await asetup_sandbox(sandbox, task)
    except BaseException:
        await sandbox.delete()
        raise
    return sandbox


async def acollect_patch(sandbox: Any, task: AnyTask) -> str:
    """Async twin of collect_patch."""
    result = await sandbox.exec("git add -A >/dev/null 2>&1; git diff --cached --binary HEAD", timeout=120,
                                cwd=task.setup.workdir)
    if result.exit_code != 0:
        raise errors.TaskError(f"task {task.id}: git diff failed: {oc.tail(result.stderr, 500)}")
    return result.stdout


async def agrade_sandbox(sandbox: Any, task: AnyTask, patch_applied: Optional[bool] = None,
                         **judge: Any) -> oc.GradeResult:
    """Async twin of grade_sandbox."""
    if isinstance(task.scoring, JudgeScoring):
        return await jg.agrade_judge(sandbox, task, patch_applied=patch_applied, **judge)
    started = time.monotonic()
    for path, content in grading_files(task).items():
        await sandbox.upload_content(content, path)
    command, timeout = scoring_command(task)
    result = await sandbox.exec(command, timeout=timeout + 30, cwd=task.setup.workdir)
    report = ""
    if isinstance(task.scoring, TestsScoring) and task.scoring.parser == "pytest-json":
        report = (await sandbox.exec(f"cat {oc.REPORT_FILE} 2>/dev/null", timeout=60)).stdout
    return result_from(task, result.exit_code, result.stdout + result.stderr, report, started, patch_applied)


async def aapply_in(sandbox: Any, task: AnyTask, patch: str) -> tuple[bool, str]:
    """Async twin of apply_in."""
    if not patch.strip():
        return True, ""
    await sandbox.upload_content(patch if patch.endswith("\n") else patch + "\n", PATCH_PATH)
    result = await sandbox.exec(apply_command(PATCH_PATH), timeout=120, cwd=task.setup.workdir)
    return result.exit_code == 0, result.stdout + result.stderr


async def agrade_patch(client: Any, task: AnyTask, patch: str, **create_kwargs: Any) -> oc.GradeResult:
    """Async twin of grade_patch."""
    started = time.monotonic()
    try:
        sandbox = await aprepare_sandbox(client, task, **create_kwargs)
        try:
            return await _agrade_in(sandbox, task, patch, started)
        finally:
            await sandbox.delete()
    except errors.OrchardError as e:
        return infra_error(task, e, started)


async def _agrade_in(sandbox: Any, task: AnyTask, patch: str, started: float) -> oc.GradeResult:
    applied, output = await aapply_in(sandbox, task, getattr(task, "test_patch", ""))
    if not applied:
        raise errors.TaskError(f"task {task.id}: its test_patch does not apply: {oc.tail(output, 500)}")
    applied, output = await aapply_in(sandbox, task, patch)
    if not applied:
        return unapplied(task, output, started)
    result = await agrade_sandbox(sandbox, task, patch_applied=True)
    result.seconds = round(time.monotonic() - started, 3)
    return result
