"""Tasks: the task model, shipped suites, image building and grading in Orchard Env sandboxes."""

from orchard.tasks.grading import (
    acollect_patch, agrade_patch, agrade_sandbox, aprepare_sandbox, collect_patch, grade_patch, grade_sandbox,
    prepare_sandbox,
)
from orchard.tasks.images import abuild_image, build_image
from orchard.tasks.judge import agrade_judge, grade_judge
from orchard.tasks.loaders import load_suite, load_tasks, save_tasks
from orchard.tasks.model import AnyTask, Budget, CheckerScoring, JudgeScoring, Setup, SWETask, Task, TestsScoring
from orchard.tasks.outcomes import GradeResult

__all__ = [
    "AnyTask", "Budget", "CheckerScoring", "GradeResult", "JudgeScoring", "Setup", "SWETask", "Task", "TestsScoring",
    "abuild_image", "acollect_patch", "agrade_judge", "agrade_patch", "agrade_sandbox", "aprepare_sandbox", "build_image",
    "collect_patch", "grade_judge", "grade_patch", "grade_sandbox", "load_suite", "load_tasks", "prepare_sandbox", "save_tasks",
]
