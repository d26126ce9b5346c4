"""Turn what a grading command printed into per-test outcomes and a typed grade (no I/O)."""

from __future__ import annotations

import json
import re
from typing import Literal, Optional

from pydantic import BaseModel, Field

REPORT_DIR = "/tmp/.orchard_grade"
REPORT_PLUGIN = "orchard_pytest_report"
REPORT_FILE = f"{REPORT_DIR}/report.json"

# A pytest plugin uploaded at grading time: one JSON object {node id: outcome}, the worst phase winning.
PLUGIN_SOURCE = '''"""Orchard grading: write each test's outcome as JSON (loaded with -p orchard_pytest_report)."""
import json, os

_RANK = {"passed": 0, "skipped": 1, "xfailed": 1, "xpassed": 1, "failed": 2, "error": 3}
_OUT = {}
_MSG = {}


def _put(nodeid, outcome):
    if _RANK.get(outcome, 3) >= _RANK.get(_OUT.get(nodeid, "passed"), 0):
        _OUT[nodeid] = outcome


def pytest_runtest_logreport(report):
    outcome = report.outcome
    if hasattr(report, "wasxfail"):
        outcome = "xfailed" if report.skipped else "xpassed"
    elif report.when != "call" and report.failed:
        outcome = "error"
    elif report.when != "call" and outcome == "passed":
        return
    _put(report.nodeid, outcome)
    if report.failed and report.nodeid not in _MSG:
        crash = getattr(report.longrepr, "reprcrash", None)
        _MSG[report.nodeid] = crash.message if crash is not None else str(report.longrepr)[-800:]


def pytest_collectreport(report):
    if report.failed:
        _OUT[report.nodeid or "<collection>"] = "error"


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("ORCHARD_PYTEST_REPORT", "/tmp/.orchard_grade/report.json")
    with open(path, "w") as f:
        json.dump(_OUT, f)
    details = os.environ.get("ORCHARD_PYTEST_DETAILS")
    if details:
        with open(details, "w") as f:
            json.dump(_MSG, f)
'''

_RA_LINE = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S.*?)(?:\s+-\s+.*)?$")
_RA_NAMES = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error", "SKIPPED": "skipped",
             "XFAIL": "xfailed", "XPASS": "xpassed"}
PASSING = ("passed", "xfailed")


class GradeResult(BaseModel):
    """The outcome of grading one final state."""

    task_id: str = Field(description="The graded task.")
    status: Literal["resolved", "unresolved", "error"] = Field(
        description="error: the grader itself could not run (infrastructure); never a model failure.")
    reward: Optional[float] = Field(description="1.0 resolved, 0.0 unresolved, None on error.")
    kind: str = Field(description="tests / checker.")
    patch_applied: Optional[bool] = Field(None, description="Whether the submitted patch applied (patch grading).")
    fail_to_pass: dict[str, str] = Field(default_factory=dict, description="FAIL_TO_PASS test -> outcome.")
    pass_to_pass: dict[str, str] = Field(default_factory=dict, description="PASS_TO_PASS test -> outcome.")
    exit_code: Optional[int] = Field(None, description="Exit code of the test command or checker.")
    output: str = Field("", description="The tail of the grading command's output.")
    error: Optional[str] = Field(None, description="What went wrong when status is error.")
    seconds: float = Field(0.0, description="Time spent grading.")

    @property
    def resolved(self) -> bool:
        return self.status == "resolved"


def parse_report(text: str) -> dict[str, str]:
    """The plugin's JSON report; an empty or broken report means no test ran."""
    try:
        data = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def parse_ra(output: str) -> dict[str, str]:
    """Outcomes from pytest's `-rA` short summary ("PASSED tests/x.py::t", "FAILED tests/x.py::t - msg")."""
    outcomes: dict[str, str] = {}
    for line in output.splitlines():
        m = _RA_LINE.match(line.strip())
        if m:
            outcomes[m.group(2)] = _RA_NAMES[m.group(1)]
    return outcomes


def judge_tests(fail_to_pass: list[str], pass_to_pass: list[str],
                outcomes: dict[str, str]) -> tuple[str, dict[str, str], dict[str, str]]:
    """Resolved when every listed test passed (a test that did not run counts as failed)."""
    f2p = {t: outcomes.get(t, "missing") for t in fail_to_pass}
    p2p = {t: outcomes.get(t, "missing") for t in pass_to_pass}
    ok = all(v in PASSING for v in f2p.values()) and all(v in PASSING for v in p2p.values())
    return ("resolved" if ok else "unresolved"), f2p, p2p


def tail(text: str, limit: int = 4000) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]
