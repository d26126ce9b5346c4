"""The shipped suites meet their promises: size, packages, splits, validation evidence, statements without the fix."""

import json
from collections import Counter, defaultdict

from orchard.tasks.images import recipes
from orchard.tasks.loaders import DATA_DIR, load_suite
from orchard.tasks.model import SWETask
from orchard.tasks.terminal import terminal_tasks


def test_swe_suite_has_200_validated_tasks_from_5_packages_split_by_package():
    tasks = load_suite("swe-mut")
    assert len(tasks) >= 200 and all(isinstance(t, SWETask) for t in tasks)
    packages = Counter(t.metadata["package"] for t in tasks)
    assert len(packages) >= 5
    splits = defaultdict(set)
    for t in tasks:
        splits[t.split].add(t.metadata["package"])
    assert splits["train"] and splits["test"] and not splits["train"] & splits["test"]
    assert len({t.instance_id for t in tasks}) == len(tasks)
    assert {t.image for t in tasks} <= set(recipes())


def test_every_swe_task_carries_its_validation_evidence():
    for t in load_suite("swe-mut"):
        v = t.metadata["validation"]
        assert t.FAIL_TO_PASS and v["failing_before"] == len(t.FAIL_TO_PASS)
        assert v["passing_after"] == len(t.FAIL_TO_PASS) + len(t.PASS_TO_PASS)
        assert v["validated_at"] and v["seconds"] > 0
    manifest = json.loads((DATA_DIR / "swe-manifest.json").read_text())
    assert manifest["tasks"] == len(load_suite("swe-mut"))


def test_problem_statements_never_contain_the_fix():
    for t in load_suite("swe-mut"):
        fixed = [line[1:].strip() for line in t.patch.splitlines() if line.startswith("+") and not line.startswith("+++")]
        assert t.problem_statement.strip() and "diff --git" not in t.problem_statement
        path = t.metadata["file"]
        assert path not in t.problem_statement or f'"{path}"' in t.problem_statement   # only as the test's own argument
        for line in fixed:
            if len(line) > 25:        # short lines (`return x`) may appear in any test; long ones are the fix
                assert line not in t.problem_statement, t.id


def test_swe_tasks_set_up_a_fresh_history_and_hide_the_bug_patch():
    t = load_suite("swe-mut")[0]
    assert t.setup.workdir == f"/workspace/{t.metadata['package']}"
    assert any("rm -rf .git && git init" in c for c in t.setup.commands)
    assert any("rm -rf /tmp/.orchard_setup" in c for c in t.setup.commands)


def test_terminal_data_file_matches_its_sources_and_has_50_tasks():
    shipped = load_suite("terminal")
    assert [t.model_dump() for t in shipped] == [t.model_dump() for t in terminal_tasks()]
    assert len(shipped) >= 50
    assert set(Counter(t.metadata["category"] for t in shipped)) == {"files", "text", "scripts", "git"}
    assert all(t.reference and t.scoring.kind == "checker" for t in shipped)
    assert {t.split for t in shipped} == {"train", "test"}
