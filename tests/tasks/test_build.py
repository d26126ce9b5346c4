"""The suite builder's host-side stages on a tiny package tree (the sandbox stages run in test_sandboxes)."""

from collections import Counter

from orchard.tasks.images import ImageRecipe, install_script
from orchard.tasks.swe.build import Screened, candidates, make_task, mutable_files, public_names, setup_for
from orchard.tasks.swe.mutate import mutations

LIB = "def double(x):\n    if x < 0:\n        return -2 * abs(x)\n    return x + x\n"
TEST = "from pkg.core import double\n\n\ndef test_double():\n    assert double(2) == 4\n"
RECIPE = ImageRecipe(image="orchard-swe-pkg:1.0", package="pkg", version="1.0", repo_dir="/workspace/pkg",
                     test_deps=["pytest==8.4.2"])


def tree(tmp_path):
    for rel, text in {"pkg/__init__.py": "", "pkg/core.py": LIB, "pkg/tests/test_core.py": TEST,
                      "tests/test_x.py": TEST, "setup.py": "x = 1\n", "docs/conf.py": "y = 2\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_only_library_files_are_mutated(tmp_path):
    assert mutable_files(tree(tmp_path), RECIPE) == ["pkg/__init__.py", "pkg/core.py"]


def test_candidates_interleave_operators_and_are_reproducible(tmp_path):
    root = tree(tmp_path)
    first = candidates(root, ["pkg/core.py"], seed=1)
    assert [m.mutated for m in first] == [m.mutated for m in candidates(root, ["pkg/core.py"], seed=1)]
    ops = [m.operator for m in first]
    assert len(set(ops[: len(Counter(ops))])) == len(Counter(ops))       # every operator appears in the first round


def test_make_task_writes_a_self_contained_swe_task(tmp_path):
    root = tree(tmp_path)
    m = next(m for m in mutations("pkg/core.py", LIB) if m.operator == "arithmetic")
    s = Screened(m, ["pkg/tests/test_core.py::test_double"], [], {"pkg/tests/test_core.py::test_double": "assert 0 == 4"})
    task = make_task(RECIPE, s, 7, "train", root, public_names(root, ["pkg/core.py"]), cap=100, seed=0)
    assert task.instance_id == "pkg__pkg-mut-0007" and task.image == RECIPE.image
    assert task.patch == m.gold_patch() and task.reference == task.patch and task.test_patch == ""
    assert task.setup.files == {"/tmp/.orchard_setup/bug.diff": m.bug_patch()}
    assert task.scoring.command.endswith("pkg/tests/test_core.py") and "PYTHONDONTWRITEBYTECODE=1" in task.scoring.command
    assert "`double`" in task.problem_statement and "assert 0 == 4" in task.problem_statement
    assert task.metadata["operator"] == "arithmetic"


def test_setup_applies_the_bug_and_restarts_history():
    setup = setup_for(RECIPE, "diff")
    assert setup.workdir == "/workspace/pkg"
    assert setup.commands[0].startswith("git apply /tmp/.orchard_setup/bug.diff")
    assert "rm -rf .git && git init" in setup.commands[1]


def test_install_script_installs_offline_and_exposes_the_venv():
    script = install_script(RECIPE, "pkg-1.0.tar.gz", ["pytest.whl"])
    assert "--no-index" in script and "'pytest==8.4.2'" in script and "--no-same-owner" in script
    assert "orchard_task_source.pth" in script and "/usr/local/bin/$b" in script
