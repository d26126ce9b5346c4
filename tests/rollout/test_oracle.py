"""The oracle teacher, driven through a real bash loop on a real git repository with a real failing test."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from orchard.errors import RequestError
from orchard.rollout.oracle import OPENERS, Oracle, OracleTask, parse_patch

SOURCE = "def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    if x >= hi:\n        return x\n    return x\n\n\ndef other(y):\n    return y\n"
FIXED = SOURCE.replace("    if x >= hi:\n        return x\n", "    if x >= hi:\n        return hi\n")
TEST = "from pkg.core import clamp\n\n\ndef test_clamp_high():\n    assert clamp(9, 0, 5) == 5\n\n\ndef test_clamp_low():\n    assert clamp(-1, 0, 5) == 0\n"


def git(cwd, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "util.py").write_text("X = 1\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_core.py").write_text(TEST)
    (tmp_path / "pkg" / "core.py").write_text(FIXED)
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "fixed")
    (tmp_path / "pkg" / "core.py").write_text(SOURCE)
    gold = git(tmp_path, "diff", "-R")            # the inverse of the bug: fixes it
    git(tmp_path, "commit", "-qam", "bug")
    return tmp_path, gold


def drive(oracle: Oracle, instruction: str, cwd, max_steps: int = 12) -> list[dict]:
    """The built-in harness's loop, run locally: ask, run the bash call, send the output back."""
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": instruction}]
    for _ in range(max_steps):
        reply = oracle.reply(messages)
        calls = [{"id": f"c{len(messages)}", "type": "function",
                  "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}} for c in reply["tool_calls"]]
        messages.append({"role": "assistant", "content": reply["content"], "tool_calls": calls})
        if not calls:
            return messages
        for call in calls:
            cmd = json.loads(call["function"]["arguments"])["command"]
            done = subprocess.run(["bash", "-c", cmd], cwd=cwd, capture_output=True, text=True)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": done.stdout + done.stderr})
    raise AssertionError("the oracle did not submit")


def suite_passes(cwd) -> bool:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=cwd,
                          capture_output=True).returncode == 0


def make(repo_dir, gold, rate=0.0, modes=("wrong_file", "partial", "premature")):
    task = OracleTask(instruction="clamp(9, 0, 5) returns 9 instead of 5", workdir=str(repo_dir), gold_patch=gold,
                      tests=["tests/test_core.py::test_clamp_high"],
                      test_command=f"{sys.executable} -m pytest -q -p no:cacheprovider")
    return Oracle([task], error_rate=rate, modes=modes)


def test_solves_like_an_engineer(repo):
    cwd, gold = repo
    assert not suite_passes(cwd)
    messages = drive(make(cwd, gold), "Bug report: clamp(9, 0, 5) returns 9 instead of 5. Please fix.", cwd)
    commands = [json.loads(m["tool_calls"][0]["function"]["arguments"])["command"]
                for m in messages if m["role"] == "assistant" and m["tool_calls"]]
    assert len(commands) == 5
    assert "find ." in commands[0] and "pytest" in commands[1] and "sed -n" in commands[2]
    assert "git apply" in commands[3] and "pytest" in commands[4]
    assert "1 failed" in messages[5]["content"] and "1 passed" in messages[11]["content"]
    assert messages[-1]["tool_calls"] == [] and suite_passes(cwd)


@pytest.mark.parametrize("mode", ["wrong_file", "partial", "premature"])
def test_each_error_mode_leaves_the_bug(repo, mode):
    cwd, gold = repo
    messages = drive(make(cwd, gold, rate=1.0, modes=(mode,)), "clamp(9, 0, 5) returns 9 instead of 5", cwd)
    assert messages[2]["content"] == OPENERS[mode]
    assert not suite_passes(cwd)
    changed = git(cwd, "diff", "--name-only").split()
    assert changed == {"wrong_file": ["pkg/util.py"], "partial": ["pkg/core.py"], "premature": []}[mode]


def test_error_rate_is_respected_and_the_mode_sticks(repo):
    cwd, gold = repo
    oracle = make(cwd, gold, rate=0.5)
    first = [{"role": "user", "content": "clamp(9, 0, 5) returns 9 instead of 5"}]
    openers = [oracle.reply(first)["content"] for _ in range(400)]
    solved = sum(o == OPENERS["solve"] for o in openers)
    assert 150 < solved < 250
    convo = first + [{"role": "assistant", "content": OPENERS["premature"], "tool_calls": []},
                     {"role": "tool", "content": "./pkg/core.py"},
                     {"role": "assistant", "content": "x", "tool_calls": []}, {"role": "tool", "content": "1 failed"},
                     {"role": "assistant", "content": "y", "tool_calls": []}, {"role": "tool", "content": "..."}]
    assert oracle.reply(convo)["tool_calls"] == []        # premature: submits right after reading


def test_unknown_task_and_bad_settings_are_clear_errors(repo):
    cwd, gold = repo
    with pytest.raises(RequestError, match="no task"):
        make(cwd, gold).reply([{"role": "user", "content": "something else"}])
    with pytest.raises(RequestError):
        Oracle([], 0.0)
    with pytest.raises(RequestError):
        make(cwd, gold, rate=1.5)


def test_parse_patch_finds_hunks(repo):
    _, gold = repo
    (hunk,) = parse_patch(gold)
    assert hunk.path == "pkg/core.py" and hunk.old_start >= 1 and "+        return hi" in hunk.text


def test_same_bug_report_for_two_tasks_is_told_apart_by_reading_the_code(repo):
    cwd, gold = repo
    decoy = gold.replace("-        return x\n+        return hi\n", "-        return max(x, hi)\n+        return hi\n")
    assert decoy != gold
    tasks = [OracleTask(instruction="clamp is broken", workdir=str(cwd), gold_patch=p,
                        tests=["tests/test_core.py::test_clamp_high"],
                        test_command=f"{sys.executable} -m pytest -q -p no:cacheprovider") for p in (decoy, gold)]
    drive(Oracle(tasks), "clamp is broken", cwd)
    assert suite_passes(cwd)
