"""The engine's HarnessRunner over the harness adapters (orchard.harnesses): one run per rollout sandbox."""

from __future__ import annotations

from typing import Any

from orchard.harnesses import get_harness
from orchard.harnesses.base import Budget, Endpoint
from orchard.harnesses.run import arun_harness
from orchard.rollout.parts import HarnessOutcome, RolloutTask, Session


def adapter(name: str) -> Any:
    """The harness adapter called ``name`` (HarnessError listing the known ones otherwise)."""
    return get_harness(name)


class AdapterRunner:
    """Runs an adapter against the session's forwarded endpoint; HarnessError (cannot start) stays an exception."""

    def __init__(self, name: str, sandbox_port: int, budget: Budget | None = None):
        self.harness = adapter(name)
        self.name = self.harness.name
        self.port = sandbox_port
        self.budget = budget or Budget()

    def _budget(self, task: RolloutTask) -> Budget:
        """The engine's budget, tightened by the task's own limits when it has them."""
        limits = getattr(getattr(task, "task", None), "budget", None)
        if limits is None:
            return self.budget
        return Budget(max_steps=min(self.budget.max_steps, limits.max_turns),
                      timeout_s=min(self.budget.timeout_s, limits.max_seconds))

    async def run(self, sandbox: Any, session: Session, model_url: str, task: RolloutTask) -> HarnessOutcome:
        endpoint = Endpoint(port=self.port, key=session.key, base_urls=session.urls)
        result = await arun_harness(None, sandbox, self.harness, endpoint, task.instruction, self._budget(task),
                                    workdir=task.workdir)
        return HarnessOutcome(stop_reason=result.reason, exit_code=result.exit_code,
                              detail=result.detail if result.reason == "error" else "")
