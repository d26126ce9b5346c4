"""The task model: what a task runs in, how it starts, what it asks and how it is scored."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Budget(_Model):
    """Limits the rollout engine enforces on one attempt."""

    max_turns: int = Field(50, gt=0, description="Model calls (agent steps) allowed.")
    max_seconds: float = Field(1800, gt=0, description="Wall-clock limit of the whole attempt.")
    max_tokens: Optional[int] = Field(None, gt=0, description="Total sampled tokens allowed (None: no limit).")


class Setup(_Model):
    """What runs in a fresh sandbox from the task image before the agent (or the grader) sees it."""

    files: dict[str, str] = Field(default_factory=dict, description="Absolute path -> text content, written first.")
    commands: list[str] = Field(default_factory=list, description="Shell commands run in order under bash; any "
                                                                  "non-zero exit fails the setup.")
    workdir: str = Field("/workspace", description="Where the agent starts and where commands run.")
    timeout: float = Field(300, gt=0, description="Seconds each setup command may take.")


class TestsScoring(_Model):
    """Scored by running tests: resolved when every FAIL_TO_PASS and PASS_TO_PASS test passes."""

    __test__ = False    # pytest: not a test class

    kind: Literal["tests"] = "tests"
    command: str = Field(description="Shell command run in the workdir that runs the tests.")
    parser: Literal["pytest-json", "pytest-ra"] = Field(
        "pytest-json", description="pytest-json: Orchard's report plugin is loaded (exact node ids); "
                                   "pytest-ra: the `-rA` summary lines of the output are parsed (SWE-bench style).")
    fail_to_pass: list[str] = Field(default_factory=list, description="Tests that must go from failing to passing.")
    pass_to_pass: list[str] = Field(default_factory=list, description="Tests that must keep passing.")
    timeout: float = Field(600, gt=0, description="Seconds the test command may take.")


class CheckerScoring(_Model):
    """Scored by a checker script run in the final sandbox: exit code 0 means solved."""

    kind: Literal["checker"] = "checker"
    script: str = Field(description="Bash script; uploaded only at grading time, so the agent never sees it.")
    timeout: float = Field(60, gt=0, description="Seconds the checker may take.")


class JudgeScoring(_Model):
    """Scored by a judge model (an OpenAI-compatible chat endpoint) against a rubric; see tasks/judge.py."""

    kind: Literal["judge"] = "judge"
    rubric: str = Field(description="What the judge is told to check.")
    reference_answer: Optional[str] = Field(None, description="A known-good answer shown to the judge (not the agent).")
    diff: bool = Field(False, description="Show the judge the agent's `git diff` of the workdir (needs a git repo).")
    files: list[str] = Field(default_factory=list, description="Files (absolute, or relative to the workdir) "
                                                               "whose content the judge sees.")
    commands: list[str] = Field(default_factory=list, description="Commands run in the workdir at grading time "
                                                                  "whose exit code and output the judge sees.")
    threshold: float = Field(0.5, ge=0, le=1, description="Resolved when the judge's score is at least this.")
    url: Optional[str] = Field(None, description="Judge base URL ending in /v1 (default: $ORCHARD_JUDGE_URL).")
    model: Optional[str] = Field(None, description="Judge model name (default: $ORCHARD_JUDGE_MODEL).")
    attempts: int = Field(3, ge=1, le=10, description="Requests before a missing or malformed verdict is an error.")
    timeout: float = Field(120, gt=0, description="Seconds each judge request (and each command) may take.")
    max_chars: int = Field(20000, gt=0, description="Each piece of evidence is cut to its last max_chars characters.")

    @model_validator(mode="after")
    def _has_evidence(self) -> "JudgeScoring":
        if not (self.diff or self.files or self.commands):
            raise ValueError("judge scoring needs evidence: diff, files or commands")
        return self


Scoring = Annotated[Union[TestsScoring, CheckerScoring, JudgeScoring], Field(discriminator="kind")]


class Task(_Model):
    """One task: image, setup, instruction, budget and scoring."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    id: str = Field(description="Unique id within its suite.")
    suite: str = Field("default", description="The suite it belongs to, e.g. 'swe-mut' or 'terminal'.")
    split: str = Field("test", description="train / test (SWE suites split by package).")
    image: str = Field("host", description="The Orchard Env image a sandbox starts from.")
    setup: Setup = Field(default_factory=Setup, description="Run before the agent starts.")
    instruction: str = Field(description="What the agent is asked to do.")
    budget: Budget = Field(default_factory=Budget, description="Limits of one attempt.")
    scoring: Scoring = Field(description="How the final state is scored.")
    reference: Optional[str] = Field(None, description="A known-good solution: a bash script run in the workdir "
                                                       "(terminal tasks) or a unified diff (SWE tasks: the gold patch).")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Free-form facts (category, validation, ...).")


def _json_list(value: Any) -> Any:
    """SWE-bench stores FAIL_TO_PASS / PASS_TO_PASS as JSON strings; accept both that and real lists."""
    if isinstance(value, str):
        return json.loads(value) if value.strip() else []
    if value is None:
        return []
    return list(value)


class SWETask(Task):
    """A SWE-bench instance: the standard fields plus what Orchard needs to run it."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    instance_id: str = Field(description="SWE-bench instance id, e.g. 'toolz__toolz-mut-0012'.")
    repo: str = Field(description="owner/name of the repository, or the PyPI project for mutation tasks.")
    base_commit: str = Field("", description="Commit the task starts from (empty for PyPI-sourced tasks).")
    version: str = Field("", description="Source version (the PyPI release for mutation tasks).")
    problem_statement: str = Field(description="The issue text the agent receives.")
    patch: str = Field("", description="Gold patch: a unified diff `git apply` accepts at the repo root.")
    test_patch: str = Field("", description="Diff adding or changing tests, applied before grading (may be empty).")
    FAIL_TO_PASS: list[str] = Field(default_factory=list, description="Test ids that the gold patch makes pass.")
    PASS_TO_PASS: list[str] = Field(default_factory=list, description="Test ids that must keep passing.")
    hints_text: str = Field("", description="SWE-bench hints (unused by graders).")
    created_at: str = Field("", description="When the instance was made.")
    environment_setup_commit: str = Field("", description="SWE-bench environment commit (informational).")
    test_command: str = Field("", description="Command running the tests; default derived from test ids.")
    instruction: str = Field("", description="Defaults to the problem statement.")
    scoring: Optional[Scoring] = Field(None, description="Derived from FAIL_TO_PASS / PASS_TO_PASS when absent.")

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _lists(cls, value: Any) -> Any:
        return _json_list(value)

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            data.setdefault("id", data.get("instance_id"))
            data.setdefault("suite", "swe-bench")
            if not data.get("image"):
                data["image"] = swebench_image(str(data.get("instance_id", "")))
        return data

    @model_validator(mode="after")
    def _derive(self) -> "SWETask":
        if not self.instruction:
            self.instruction = self.problem_statement
        if self.reference is None and self.patch:
            self.reference = self.patch
        if self.scoring is None:
            self.scoring = TestsScoring(command=self.test_command or default_test_command(self),
                                        parser="pytest-ra", fail_to_pass=self.FAIL_TO_PASS,
                                        pass_to_pass=self.PASS_TO_PASS)
        if self.setup.workdir == "/workspace" and self.suite == "swe-bench":
            self.setup.workdir = "/testbed"
        return self


def swebench_image(instance_id: str) -> str:
    """The public SWE-bench evaluation image of an instance (pullable by the container backend)."""
    return f"swebench/sweb.eval.x86_64.{instance_id.replace('__', '_1776_').lower()}:latest"


# SWE-bench images keep the repository's environment in a conda env named testbed.
CONDA_TESTBED = "if [ -f /opt/miniconda3/bin/activate ]; then . /opt/miniconda3/bin/activate testbed; fi; "


def default_test_command(task: SWETask) -> str:
    """pytest over the files the listed tests live in, with the `-rA` summary the pytest-ra parser reads."""
    files = sorted({t.split("::")[0] for t in task.FAIL_TO_PASS + task.PASS_TO_PASS if "::" in t})
    return CONDA_TESTBED + ("pytest -rA " + " ".join(files) if files else "pytest -rA")


AnyTask = Union[SWETask, Task]


def task_from_dict(row: dict[str, Any]) -> AnyTask:
    """A SWE task when the row has an instance_id (SWE-bench layout), a plain task otherwise."""
    if "instance_id" in row and row.get("instance_id"):
        return SWETask.model_validate(_decode_json_fields(row))
    return Task.model_validate(_decode_json_fields(row))


def _decode_json_fields(row: dict[str, Any]) -> dict[str, Any]:
    """Nested fields stored as JSON text (Parquet, CSV-like exports) become objects again; nulls mean absent."""
    out = {k: v for k, v in row.items() if v is not None}
    for key in ("setup", "budget", "scoring", "metadata"):
        if isinstance(out.get(key), str):
            out[key] = json.loads(out[key]) if out[key] else None
        if out.get(key) is None:
            out.pop(key, None)
    return out
