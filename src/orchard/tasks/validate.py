"""Check that a task is sound in a real sandbox: unsolved as set up, solved by its reference.

SWE tasks: every FAIL_TO_PASS test fails after setup, and with the gold patch every listed test
passes. Checker tasks: the checker fails after setup, and passes once the reference solution ran.
"""

from __future__ import annotations

import datetime as dt
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional

from pydantic import BaseModel, Field

from orchard import errors
from orchard.tasks import grading
from orchard.tasks.model import AnyTask, CheckerScoring, TestsScoring
from orchard.tasks.outcomes import PASSING, tail


class Validation(BaseModel):
    """The evidence for one task."""

    task_id: str
    ok: bool = Field(description="Unsolved as set up and solved by the reference.")
    reason: str = Field("", description="Why not, when ok is false.")
    validated_at: str = Field(description="UTC time of the check.")
    seconds: float = Field(description="Time the check took.")
    failing_before: int = Field(0, description="FAIL_TO_PASS tests failing as set up (1 for a failing checker).")
    passing_after: int = Field(0, description="Listed tests passing with the reference (1 for a passing checker).")


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def validate_task(client: Any, task: AnyTask, **create_kwargs: Any) -> Validation:
    """Run the check in one fresh sandbox; infrastructure errors become a failed Validation with the reason."""
    started = time.monotonic()
    try:
        with grading.prepare_sandbox(client, task, **create_kwargs) as sandbox:
            ok, reason, before, after = _check(sandbox, task)
    except errors.OrchardError as e:
        ok, reason, before, after = False, f"{type(e).__name__}: {e}", 0, 0
    return Validation(task_id=task.id, ok=ok, reason=reason, validated_at=_now(),
                      seconds=round(time.monotonic() - started, 2), failing_before=before, passing_after=after)


def _check(sandbox: Any, task: AnyTask) -> tuple[bool, str, int, int]:
    if not task.reference:
        return False, "the task has no reference solution", 0, 0
    before = grading.grade_sandbox(sandbox, task)
    if isinstance(task.scoring, CheckerScoring):
        return _check_checker(sandbox, task, before)
    if isinstance(task.scoring, TestsScoring):
        return _check_tests(sandbox, task, before)
    return False, "judge-scored tasks are not validated in a sandbox", 0, 0


def _check_checker(sandbox: Any, task: AnyTask, before: Any) -> tuple[bool, str, int, int]:
    if before.resolved:
        return False, "the checker passes before any work was done", 0, 0
    run = sandbox.exec(task.reference, timeout=task.budget.max_seconds, cwd=task.setup.workdir)
    after = grading.grade_sandbox(sandbox, task)
    if not after.resolved:
        return False, f"the reference (exit {run.exit_code}) does not satisfy the checker: {tail(after.output, 800)}", 1, 0
    return True, "", 1, 1


def _check_tests(sandbox: Any, task: AnyTask, before: Any) -> tuple[bool, str, int, int]:
    failing = sum(o not in PASSING for o in before.fail_to_pass.values())
    if not before.fail_to_pass or failing != len(before.fail_to_pass):
        return False, f"only {failing} of {len(before.fail_to_pass)} FAIL_TO_PASS tests fail as set up", failing, 0
    applied, output = grading.apply_in(sandbox, task, task.reference)
    if not applied:
        return False, f"the gold patch does not apply: {tail(output, 800)}", failing, 0
    after = grading.grade_sandbox(sandbox, task)
    passing = sum(o in PASSING for o in list(after.fail_to_pass.values()) + list(after.pass_to_pass.values()))
    if not after.resolved:
        bad = [t for t, o in {**after.fail_to_pass, **after.pass_to_pass}.items() if o not in PASSING][:5]
        return False, f"with the gold patch these still fail: {bad}", failing, passing
    return True, "", failing, passing


def validate_all(client: Any, tasks: list[AnyTask], concurrency: int = 2,
                 progress: Optional[Callable[[Validation], None]] = None) -> list[Validation]:
    """Validate many tasks, a few at a time, in task order."""
    def one(task: AnyTask) -> Validation:
        result = validate_task(client, task)
        if progress:
            progress(result)
        return result

    with ThreadPoolExecutor(max(1, concurrency)) as pool:
        return list(pool.map(one, tasks))
