"""`orchard demo` (what `make demo` runs): the whole loop on real SWE tasks, under the 10 minutes it promises."""

from __future__ import annotations

import json
import time

import pytest

from orchard.cli import main
from orchard.rollout.demo import pick_tasks


def test_pick_tasks_spreads_over_groups():
    picked = pick_tasks("terminal", 6)
    assert len(picked) == 6 and len({t.metadata.get("category") for t in picked}) >= 3


@pytest.mark.slow
def test_demo_runs_the_whole_loop(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ORCHARD_TOOLS_DIR", str(tmp_path / "tools"))
    started = time.monotonic()
    assert main(["demo", "--tasks", "3", "--samples", "2", "--out", str(tmp_path / "demo"), "--no-view"]) == 0
    assert time.monotonic() - started < 600
    out = capsys.readouterr().out
    assert "resolve rate" in out and "orchard view" in out
    report = json.loads((tmp_path / "demo" / "eval" / "report.json").read_text())["report"]
    assert report["rollouts"] == 6 and report["infra_failures"] == {} and len(report["per_group"]) == 2   # the test split holds two packages
