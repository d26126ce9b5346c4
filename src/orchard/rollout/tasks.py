"""Tasks of the task suites (orchard.tasks) as the engine runs them, and the tiny echo tasks used in tests."""

from __future__ import annotations

from typing import Any

from orchard import errors
from orchard.rollout.parts import Grade
from orchard.tasks.grading import acreate_task_sandbox, agrade_patch, agrade_sandbox, asetup_sandbox
from orchard.tasks.images import is_buildable
from orchard.tasks.loaders import load_suite
from orchard.tasks.model import AnyTask, CheckerScoring, Task, TestsScoring


class SuiteTask:
    """One orchard.tasks task: set up through its Setup, graded by its scoring.

    Tests scoring (SWE) grades the collected patch in a fresh sandbox from the task image; checker and judge
    scoring grade the rollout's own sandbox, whose final state is the answer (the judge endpoint comes from
    the task's scoring or ORCHARD_JUDGE_URL / ORCHARD_JUDGE_MODEL).
    """

    def __init__(self, task: AnyTask):
        if task.scoring is None:
            raise errors.RequestError(f"task {task.id}: has no scoring")
        self.task = task
        self.task_id, self.image, self.instruction = task.id, task.image, task.instruction
        self.workdir = task.setup.workdir
        meta = task.metadata
        self.group = str(meta.get("package") or getattr(task, "repo", "") or meta.get("category") or task.suite)

    async def create(self, client: Any, **kwargs: Any) -> Any:
        """A sandbox from the task image (built on demand when the suite knows how)."""
        return await acreate_task_sandbox(client, self.task, **kwargs)

    async def prepare(self, client: Any) -> None:
        """Make sure the task image exists (building it when the suite knows how), once per image per run."""
        if is_buildable(self.image):
            sandbox = await acreate_task_sandbox(client, self.task, ttl_seconds=600)
            await sandbox.delete()

    async def setup(self, sandbox: Any) -> None:
        await asetup_sandbox(sandbox, self.task)

    async def grade(self, client: Any, sandbox: Any, patch: str) -> Grade:
        if isinstance(self.task.scoring, TestsScoring):
            result = await agrade_patch(client, self.task, patch)
        else:
            result = await agrade_sandbox(sandbox, self.task)
        if result.status == "error" or result.reward is None:
            raise errors.GraderError(f"task {self.task_id}: the grader could not reach a verdict: {result.error}")
        return Grade(reward=result.reward, resolved=result.resolved, detail=_summary(result))


def _summary(result: Any) -> str:
    failing = [t for t, v in {**result.fail_to_pass, **result.pass_to_pass}.items() if v not in ("passed", "xfailed")]
    head = f"{result.status} (exit {result.exit_code}, patch applied: {result.patch_applied})"
    if failing:
        head += "; not passing: " + ", ".join(failing[:10])
    return head + "\n" + (result.output or "")[-1500:]


def echo_tasks(n: int = 3) -> list[Task]:
    """n tiny tasks: write a given word into /workspace/answer.txt (checker scoring, host image)."""
    words = ["hello", "orchard", "sandbox", "rollout", "reward", "harness", "teacher", "sample"]
    out = []
    for i in range(n):
        word = words[i % len(words)] + ("" if i < len(words) else str(i))
        out.append(Task(id=f"echo-{i}", suite="echo", image="host", metadata={"category": "echo"},
                        instruction=f"Write the word {word} (and nothing else but a newline) into /workspace/answer.txt.",
                        scoring=CheckerScoring(script=f'test "$(cat /workspace/answer.txt)" = {word}'),
                        reference=f"echo {word} > /workspace/answer.txt"))
    return out


def load(source: str, split: str | None = None, limit: int | None = None) -> list[SuiteTask]:
    """Tasks from a shipped suite name, a task file or folder, or 'echo' / 'echo:N' for the echo tasks."""
    if source == "echo" or source.startswith("echo:"):
        tasks: list[AnyTask] = echo_tasks(int(source.split(":")[1]) if ":" in source else 3)
    else:
        tasks = load_suite(source, split)
    return [SuiteTask(t) for t in tasks[:limit]]
