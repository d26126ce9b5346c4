"""End to end in real sandboxes: SWE tasks graded through the SDK (image built on demand), every terminal checker."""

import pytest

from orchard.tasks import agrade_patch, collect_patch, grade_patch, grade_sandbox, load_suite, prepare_sandbox
from orchard.tasks.model import CheckerScoring, Task
from orchard.tasks.validate import validate_all, validate_task


def sample_swe_tasks():
    """One task of the test split and one of the train split: two packages, two images."""
    tasks = load_suite("swe-mut")
    return [next(t for t in tasks if t.split == "test"), next(t for t in tasks if t.split == "train")]


@pytest.mark.parametrize("index", [0, 1])
def test_swe_task_grades_gold_resolved_and_no_patch_unresolved(client, index):
    task = sample_swe_tasks()[index]
    assert validate_task(client, task).ok            # builds the image when missing; F2P fail, gold passes
    gold = grade_patch(client, task, task.patch)
    assert gold.status == "resolved" and gold.reward == 1.0 and gold.patch_applied
    assert set(gold.fail_to_pass.values()) <= {"passed", "xfailed"}
    nothing = grade_patch(client, task, "")
    assert nothing.status == "unresolved" and nothing.reward == 0.0
    assert all(v not in ("passed", "xfailed") for v in nothing.fail_to_pass.values())


def test_agent_flow_edit_collect_patch_and_grade_in_a_fresh_sandbox(client):
    task = sample_swe_tasks()[0]
    with prepare_sandbox(client, task) as sandbox:
        assert sandbox.exec("git status --porcelain", cwd=task.setup.workdir).stdout == ""
        assert sandbox.exec("git log --oneline | wc -l", cwd=task.setup.workdir).stdout.strip() == "1"
        assert sandbox.exec("ls /tmp/.orchard_setup 2>&1").exit_code != 0        # the bug patch is gone
        sandbox.upload_content(task.patch, "/tmp/fix.diff")
        assert sandbox.exec("git apply /tmp/fix.diff", cwd=task.setup.workdir).exit_code == 0
        patch = collect_patch(sandbox, task)
    assert patch.startswith("diff --git")
    assert grade_patch(client, task, patch).resolved


def test_a_patch_that_does_not_apply_is_a_model_failure(client):
    task = sample_swe_tasks()[0]
    result = grade_patch(client, task, "diff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-x\n+y\n")
    assert result.status == "unresolved" and result.patch_applied is False and result.reward == 0.0


async def test_async_grading_twin(env_url):
    from orchard import AsyncSandboxClient

    task = sample_swe_tasks()[1]
    async with AsyncSandboxClient(base_url=env_url) as client:
        result = await agrade_patch(client, task, task.patch)
    assert result.resolved


def test_an_unknown_image_is_an_infrastructure_error_not_a_failure(client):
    task = sample_swe_tasks()[0].model_copy(update={"image": "orchard-swe-nothing:0"})
    result = grade_patch(client, task, task.patch)
    assert result.status == "error" and result.reward is None and "nothing" in result.error


def test_every_terminal_checker_fails_untouched_and_passes_with_its_reference(client):
    tasks = load_suite("terminal")
    results = validate_all(client, tasks, concurrency=3)
    bad = [(r.task_id, r.reason) for r in results if not r.ok]
    assert not bad
    assert len(results) >= 50


def test_a_wrong_terminal_answer_is_unresolved(client):
    task = Task(id="t", instruction="write hi", scoring=CheckerScoring(script="test \"$(cat out.txt)\" = hi"),
                reference="echo hi > out.txt")
    with prepare_sandbox(client, task) as sandbox:
        sandbox.exec("echo ho > out.txt", cwd="/workspace")
        assert grade_sandbox(sandbox, task).status == "unresolved"
        sandbox.exec("echo hi > out.txt", cwd="/workspace")
        assert grade_sandbox(sandbox, task).resolved


def test_a_missing_image_is_built_once_for_concurrent_callers(monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    from orchard import SandboxClient
    from orchard.env.runner import ServiceProcess
    from orchard.tasks import grading

    builds = []
    real = grading.build_image
    monkeypatch.setattr(grading, "build_image", lambda c, image: builds.append(image) or real(c, image))
    task = sample_swe_tasks()[0]
    with ServiceProcess(args=["--no-auth"]) as service, SandboxClient(base_url=service.url) as client:
        with ThreadPoolExecutor(3) as pool:
            sandboxes = list(pool.map(lambda _: grading.create_task_sandbox(client, task), range(3)))
        for sb in sandboxes:
            assert sb.exec("python -c 'import pytest'", cwd=task.setup.workdir).exit_code == 0
            sb.delete()
    assert builds == [task.image]


def test_the_swebench_style_ra_parser_grades_the_same(client):
    task = sample_swe_tasks()[0]
    scoring = task.scoring.model_copy(update={"parser": "pytest-ra", "command": task.scoring.command + " -rA"})
    ra_task = task.model_copy(update={"scoring": scoring})
    assert grade_patch(client, ra_task, task.patch).resolved
    assert grade_patch(client, ra_task, "").status == "unresolved"
