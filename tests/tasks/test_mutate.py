"""Mutation operators: each makes the edit it names, only that edit, and the diffs invert each other under git."""

import subprocess
from pathlib import Path

import pytest

from orchard.tasks.swe.mutate import mutations, unified_diff

SOURCE = '''"""Module docstring."""
from typing import Optional


def clamp(x: int, lo: int, hi: int) -> int:
    """Docstring stays."""
    if x < lo and lo is not None:
        return lo
    total = x + 1
    log(total)
    for i in range(3):
        if not i:
            continue
        break
    return hi if x >= hi else x


def flag() -> bool:
    return True
'''


def by_op(op):
    return [m for m in mutations("pkg/mod.py", SOURCE) if m.operator == op]


def changed_lines(m):
    return [(a, b) for a, b in zip(m.original.splitlines(), m.mutated.splitlines()) if a != b]


@pytest.mark.parametrize("op, before, after", [
    ("compare", "    if x < lo and lo is not None:", "    if x <= lo and lo is not None:"),
    ("compare", "    if x < lo and lo is not None:", "    if x < lo and lo is None:"),
    ("compare", "    return hi if x >= hi else x", "    return hi if x > hi else x"),
    ("boolean", "    if x < lo and lo is not None:", "    if x < lo or lo is not None:"),
    ("negation", "        if not i:", "        if i:"),
    ("off_by_one", "    total = x + 1", "    total = x + 2"),
    ("off_by_one", "    total = x + 1", "    total = x + 0"),
    ("off_by_one", "    for i in range(3):", "    for i in range(4):"),
    ("arithmetic", "    total = x + 1", "    total = x - 1"),
    ("return_value", "        return lo", "        return None"),
    ("return_value", "    return True", "    return False"),
    ("loop_control", "            continue", "            break"),
    ("loop_control", "        break", "        continue"),
])
def test_operator_makes_exactly_one_named_edit(op, before, after):
    assert (before, after) in [changed_lines(m)[0] for m in by_op(op) if len(changed_lines(m)) == 1]
    for m in by_op(op):
        assert len(changed_lines(m)) == 1 and m.operator == op


def test_drop_statement_removes_one_simple_line_never_a_docstring():
    dropped = {m.original.count("\n") - m.mutated.count("\n") for m in by_op("drop_statement")}
    assert dropped == {1}
    removed = {next(line for line in m.original.splitlines() if line not in m.mutated.splitlines())
               for m in by_op("drop_statement")}
    assert "    total = x + 1" in removed and "    log(total)" in removed
    assert not any("Docstring" in line for line in removed)


def test_annotations_and_module_docstring_are_never_mutated():
    for m in mutations("pkg/mod.py", SOURCE):
        line = m.original.splitlines()[m.line - 1]
        assert not line.startswith("def ") and "Module docstring" not in line


def test_every_mutation_parses_and_is_unique():
    import ast

    found = mutations("pkg/mod.py", SOURCE)
    assert len(found) == len({m.mutated for m in found}) > 15
    for m in found:
        ast.parse(m.mutated)


def test_a_file_that_does_not_parse_yields_nothing():
    assert mutations("bad.py", "def (:\n") == []


def git(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)


def test_bug_and_gold_patches_apply_with_git_and_invert_each_other(tmp_path):
    m = by_op("compare")[0]
    (tmp_path / "pkg").mkdir()
    target = tmp_path / "pkg" / "mod.py"
    target.write_text(m.original)
    assert git(tmp_path, "init", "-q").returncode == 0
    (tmp_path / "bug.diff").write_text(m.bug_patch())
    (tmp_path / "gold.diff").write_text(m.gold_patch())
    assert git(tmp_path, "apply", "bug.diff").returncode == 0
    assert target.read_text() == m.mutated
    assert git(tmp_path, "apply", "gold.diff").returncode == 0
    assert target.read_text() == m.original


def test_unified_diff_of_identical_texts_is_empty():
    assert unified_diff("a.py", "x\n", "x\n") == ""
