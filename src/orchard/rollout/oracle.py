"""The oracle teacher: a scripted-model policy that solves tasks through a bash tool, knowing the gold patch.

It plays a competent engineer through the built-in harness's ``bash`` tool: explore the repository,
reproduce the failure, read the failing code, edit (the gold patch applied from a heredoc), run the
tests again, submit. With probability ``error_rate`` a conversation instead goes one of three realistic
wrong ways: **wrong_file** (edits another module), **partial** (touches the right place but leaves the
bug, or applies only the first hunk), **premature** (submits after reading, without editing). That gives
distillation both resolved and unresolved trajectories without a hosted model.

The policy is stateless, as a model server must be: each call sees the whole conversation, finds its task
by the instruction in the first user message, and recovers the conversation's mode from the wording of its
own first thought (each mode opens with its own sentence, drawn once, on the first call).

Real distillation does not use this: point the rollout engine's ``--model`` at a real model endpoint
(vLLM, SGLang, a hosted API behind an OpenAI-compatible server) and keep everything else the same.
"""

from __future__ import annotations

import random
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Optional

from orchard.errors import RequestError

MODES = ("solve", "wrong_file", "partial", "premature")
OPENERS = {
    "solve": "Let me start by looking at the repository layout.",
    "wrong_file": "First I will get an overview of the project's files.",
    "partial": "I'll begin by exploring the code base.",
    "premature": "Let me look around the repository first.",
}
EOF_MARK = "ORCHARD_EOF"


@dataclass
class OracleTask:
    """What the oracle knows about a task (from the task suite: the answer key)."""

    instruction: str
    workdir: str
    gold_patch: str = ""
    """Unified diff that fixes the task (SWE tasks); empty for tasks solved by ``solution``."""
    tests: list[str] = field(default_factory=list)
    """Tests that fail before the fix (FAIL_TO_PASS ids), used to reproduce and to verify."""
    test_command: str = "python -m pytest -p no:cacheprovider -o addopts='' -q"
    """How the oracle runs a few test ids (the SWE task images put their venv's python first on PATH)."""
    solution: str = ""
    """A shell script that solves the task (terminal tasks' reference solution)."""


@dataclass
class Hunk:
    path: str
    old_start: int
    old_len: int
    text: str
    """The hunk's lines including its @@ header."""


@dataclass
class Action:
    thought: str
    command: Optional[str] = None
    """None ends the run: the thought is the submission."""


def parse_patch(patch: str) -> list[Hunk]:
    """The hunks of a unified diff, with the file each belongs to."""
    hunks: list[Hunk] = []
    path = None
    current: Optional[Hunk] = None
    for line in patch.splitlines(keepends=True):
        if line.startswith("+++ "):
            path = re.sub(r"^[ab]/", "", line[4:].strip().split("\t")[0])
            current = None
        elif line.startswith("@@") and path:
            m = re.match(r"@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@", line)
            if not m:
                raise RequestError(f"bad hunk header in gold patch: {line.strip()}")
            current = Hunk(path, int(m.group(1)), int(m.group(2) or 1), line)
            hunks.append(current)
        elif current is not None and line[:1] in (" ", "+", "-", "\\"):
            current.text += line
    return hunks


def _file_patch(hunks: list[Hunk]) -> str:
    """A unified diff of the given hunks (all of one file or several)."""
    out, seen = [], None
    for h in hunks:
        if h.path != seen:
            out.append(f"--- a/{h.path}\n+++ b/{h.path}\n")
            seen = h.path
        out.append(h.text if h.text.endswith("\n") else h.text + "\n")
    return "".join(out)


def _heredoc_apply(workdir: str, patch: str) -> str:
    return (f"cd {workdir} && cat > /tmp/fix.patch <<'{EOF_MARK}'\n{patch}{EOF_MARK}\n"
            "git apply --whitespace=nowarn /tmp/fix.patch && git diff --stat")


class Plan:
    """The actions of one conversation, given its task, mode and what the exploration showed."""

    def __init__(self, task: OracleTask, mode: str, explored: str, also_read: Optional[list[Hunk]] = None):
        self.task, self.mode, self.explored = task, mode, explored
        self.hunks = parse_patch(task.gold_patch) if task.gold_patch else []
        self.also_read = also_read or []
        """Hunks of other tasks with the same instruction: read too, so the code shows which bug this is."""

    def actions(self) -> list[Action]:
        t = self.task
        if not self.hunks:
            return self._scripted_actions()
        files = sorted({h.path for h in self.hunks})
        steps = [Action(OPENERS[self.mode], f"cd {t.workdir} && git status --short && find . -name '*.py' "
                                            "-not -path '*/.*' | sort | head -80"),
                 Action("Let me reproduce the failure with the tests from the report.", self._test_cmd()),
                 Action(f"The failure points at {', '.join(files)}. Let me read the relevant code.", self._read_cmd())]
        return steps + getattr(self, f"_{self.mode}")()

    def _test_cmd(self) -> str:
        t = self.task
        return f"cd {t.workdir} && {t.test_command} {' '.join(_quote(x) for x in t.tests[:5])} 2>&1 | tail -40"

    def _read_cmd(self) -> str:
        spans = dict.fromkeys((h.path, max(1, h.old_start - 8), h.old_start + h.old_len + 8)
                              for h in self.hunks[:4] + self.also_read[:8])
        parts = [f"sed -n '{a},{b}p' {path}" for path, a, b in spans]
        return f"cd {self.task.workdir} && " + " && echo ---- && ".join(parts)

    def _verify(self) -> Action:
        return Action("Now let me run the failing tests again.", self._test_cmd())

    def _solve(self) -> list[Action]:
        return [Action("I see the bug. Let me fix it.", _heredoc_apply(self.task.workdir, self.task.gold_patch)),
                self._verify(), Action("The fix is in place and the tests that reproduced the issue now pass.")]

    def _partial(self) -> list[Action]:
        if len(self.hunks) > 1:
            edit = _heredoc_apply(self.task.workdir, _file_patch(self.hunks[:1]))
        else:
            h = self.hunks[0]
            edit = f"cd {self.task.workdir} && sed -i '{h.old_start}i # TODO: double-check this logic' {h.path} && git diff --stat"
        return [Action("I think I found it; let me adjust this part.", edit), self._verify(),
                Action("I adjusted the code where the problem is; this should address the report.")]

    def _wrong_file(self) -> list[Action]:
        target = self._other_file()
        edit = f"cd {self.task.workdir} && sed -i '1i # Reviewed for the reported issue.' {target} && git diff --stat"
        return [Action(f"The problem is probably in {target}. Let me change it.", edit), self._verify(),
                Action(f"I updated {target} to handle the reported case.")]

    def _premature(self) -> list[Action]:
        return [Action("This looks like an edge case that is already handled; I believe no change is needed here.")]

    def _other_file(self) -> str:
        """A source file from the exploration output that the gold patch does not touch."""
        touched = {h.path for h in self.hunks}
        names = [ln.strip().removeprefix("./") for ln in self.explored.splitlines() if ln.strip().endswith(".py")]
        others = [n for n in names if n not in touched and "test" not in n and not n.endswith("__init__.py")]
        others = others or [n for n in names if n not in touched] or ["setup.py"]
        return others[len(self.task.instruction) % len(others)]

    def _scripted_actions(self) -> list[Action]:
        """Tasks solved by a reference script (terminal tasks)."""
        t = self.task
        explore = Action(OPENERS[self.mode], f"cd {t.workdir} && ls -la")
        if self.mode == "premature" or not t.solution:
            return [explore, Action("That looks done already.")]
        lines = t.solution.strip().splitlines()
        if self.mode == "partial" and len(lines) < 2:
            return [explore, Action("Looks like most of it is there already; done.")]
        script = "\n".join(lines[: len(lines) // 2]) if self.mode == "partial" else t.solution.strip()
        where = t.workdir
        if self.mode == "wrong_file":   # the right commands aimed at the wrong place
            script, where = script.replace(t.workdir.rstrip("/") + "/", "/tmp/"), "/tmp"
        run = f"cd {where} && bash <<'{EOF_MARK}'\n{script}\n{EOF_MARK}"
        return [explore, Action("I know what to do; let me write it.", run),
                Action("Let me check the result.", f"cd {t.workdir} && ls -la"), Action("Done: the task is complete.")]


def _quote(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


class Oracle:
    """The policy: conversation in, next action out (a thought plus one bash call, or a final answer)."""

    def __init__(self, tasks: list[OracleTask], error_rate: float = 0.0, seed: int = 0,
                 modes: tuple[str, ...] = ("wrong_file", "partial", "premature")):
        if not 0.0 <= error_rate <= 1.0:
            raise RequestError("error_rate must be between 0 and 1")
        if not tasks:
            raise RequestError("the oracle needs at least one task")
        self.tasks, self.error_rate, self.modes = tasks, error_rate, modes
        self._rng, self._lock = random.Random(seed), threading.Lock()

    def candidates(self, messages: list[dict[str, Any]]) -> list[OracleTask]:
        """The tasks whose instruction the first user message carries (several when bug reports coincide)."""
        user = next((_content(m) for m in messages if m.get("role") == "user"), "")
        found = [t for t in self.tasks if t.instruction.strip() and t.instruction.strip() in user]
        if not found:
            raise RequestError("the oracle knows no task with this instruction")
        longest = max(len(t.instruction) for t in found)
        return [t for t in found if len(t.instruction) == longest]

    def find(self, messages: list[dict[str, Any]]) -> OracleTask:
        """The task of this conversation: among same-instruction tasks, the one whose buggy lines the tool
        outputs so far show (as an engineer tells two bugs apart by reading the code)."""
        found = self.candidates(messages)
        seen = "\n".join(_content(m) for m in messages if m.get("role") == "tool")
        shown = [t for t in found if _removed_lines(t.gold_patch) and all(ln in seen for ln in _removed_lines(t.gold_patch))]
        return (shown or found)[0]

    def _mode(self, assistant: list[dict[str, Any]]) -> str:
        if assistant:
            first = _content(assistant[0])
            return next((m for m, s in OPENERS.items() if first.startswith(s)), "solve")
        with self._lock:
            wrong = self._rng.random() < self.error_rate
            return self._rng.choice(self.modes) if wrong else "solve"

    def next_action(self, messages: list[dict[str, Any]]) -> Action:
        task = self.find(messages)
        others = [h for t in self.candidates(messages) if t is not task and t.gold_patch for h in parse_patch(t.gold_patch)]
        assistant = [m for m in messages if m.get("role") == "assistant"]
        explored = next((_content(m) for m in messages if m.get("role") == "tool"), "")
        actions = Plan(task, self._mode(assistant), explored, others).actions()
        return actions[min(len(assistant), len(actions) - 1)]

    def reply(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """The next assistant turn as the scripted engine takes it: content plus at most one ``bash`` call."""
        action = self.next_action(messages)
        calls = [] if action.command is None else [{"name": "bash", "arguments": {"command": action.command}}]
        return {"content": action.thought, "tool_calls": calls}

    def __call__(self, request: Any) -> dict[str, Any]:
        """The scripted engine's policy interface: a parsed chat request in, a reply out."""
        messages = [m if isinstance(m, dict) else m.model_dump() for m in request.messages]
        return self.reply(messages)


def oracle_task(task: Any) -> OracleTask:
    """The answer key of a task from the task suite (orchard.tasks): gold patch and tests, or reference script."""
    patch = getattr(task, "patch", "") or ""
    return OracleTask(instruction=task.instruction, workdir=task.setup.workdir, gold_patch=patch,
                      tests=list(getattr(task, "FAIL_TO_PASS", []) or []),
                      solution="" if patch else (task.reference or ""))


_DEFAULT: Optional[Oracle] = None


def policy(request: Any) -> dict[str, Any]:
    """``--policy orchard.rollout.oracle:policy``: an oracle over ORCHARD_ORACLE_TASKS (a task file or suite name),
    with ORCHARD_ORACLE_ERROR_RATE (default 0.3) and ORCHARD_ORACLE_SEED (default 0)."""
    global _DEFAULT
    if _DEFAULT is None:
        import os

        from orchard.tasks.loaders import load_suite

        source = os.environ.get("ORCHARD_ORACLE_TASKS")
        if not source:
            raise RequestError("set ORCHARD_ORACLE_TASKS to the task file or suite the oracle answers for")
        _DEFAULT = Oracle([oracle_task(t) for t in load_suite(source)],
                          error_rate=float(os.environ.get("ORCHARD_ORACLE_ERROR_RATE", "0.3")),
                          seed=int(os.environ.get("ORCHARD_ORACLE_SEED", "0")))
    return _DEFAULT(request)


def _removed_lines(patch: str) -> list[str]:
    """The buggy lines a gold patch removes, stripped (what reading the code reveals)."""
    return [ln[1:].strip() for ln in patch.splitlines() if ln.startswith("-") and not ln.startswith("---") and ln[1:].strip()]


def _content(m: dict[str, Any]) -> str:
    c = m.get("content")
    if isinstance(c, list):
        return "".join(p.get("text", "") for p in c if isinstance(p, dict))
    return c or ""
