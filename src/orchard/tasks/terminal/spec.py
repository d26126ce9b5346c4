"""How a terminal task is written down: setup, instruction, reference solution and checker, as shell text."""

from __future__ import annotations

from dataclasses import dataclass

from orchard.tasks.model import Budget, CheckerScoring, Setup, Task

WORKDIR = "/workspace"


@dataclass(frozen=True)
class TerminalSpec:
    """One terminal task; every script runs under bash in /workspace."""

    id: str
    instruction: str
    setup: str           # builds the starting state
    solution: str        # a known-good answer (the reference; never shown to the agent)
    checker: str         # exit 0 when the final state is right

    def to_task(self, category: str, split: str = "train") -> Task:
        commands = [self.setup] if self.setup.strip() else []
        checker = f"set -u\ncd {WORKDIR}\n{self.checker}\n"
        return Task(id=f"terminal/{self.id}", suite="terminal", split=split, image="host",
                    setup=Setup(commands=commands, workdir=WORKDIR, timeout=60), instruction=self.instruction,
                    budget=Budget(max_turns=20, max_seconds=600),
                    scoring=CheckerScoring(script=checker, timeout=60), reference=self.solution,
                    metadata={"category": category})
