"""The terminal suite: small shell tasks (files, text, scripts, git), each with a checker and a reference solution."""

from __future__ import annotations

from orchard.tasks.model import Task
from orchard.tasks.terminal import files, git, scripts, text

CATEGORIES = {"files": files.TASKS, "text": text.TASKS, "scripts": scripts.TASKS, "git": git.TASKS}


def terminal_tasks() -> list[Task]:
    """Every terminal task, in category order; every fifth task of a category is held out as test."""
    return [spec.to_task(category, "test" if i % 5 == 4 else "train")
            for category, specs in CATEGORIES.items() for i, spec in enumerate(specs)]
