"""Crash safety: a run killed with SIGKILL mid-way resumes with no rollout lost and none run twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from orchard.rollout.journal import Journal
from orchard.rollout.tasks import SuiteTask, echo_tasks

from tests.rollout.test_engine import run_engine

ROOT = Path(__file__).resolve().parents[2]


def journal_ids(path: Path) -> list[str]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line)["row"]["rollout_id"] for line in lines if line.endswith("}")]


async def test_killed_run_resumes_without_duplicates_or_losses(env_url, proxy_url, oracle, tmp_path):
    oracle.error_rate = 0.0
    out = tmp_path / "run"
    child = subprocess.Popen([sys.executable, "-m", "tests.rollout.resume_child", env_url, proxy_url, str(out)],
                             cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 240
    while len(journal_ids(out / "journal.jsonl")) < 3:
        assert child.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
    before = journal_ids(out / "journal.jsonl")
    assert 3 <= len(before) < 12
    with open(out / "journal.jsonl", "a") as fh:         # a line cut short by the crash
        fh.write('{"row": {"rollout_id": "echo-5#1", "reward"')

    tasks = [SuiteTask(t) for t in echo_tasks(6)]
    run = await run_engine(env_url, proxy_url, out, tasks, samples=2, concurrency=4, resume=True)
    after = journal_ids(out / "journal.jsonl")
    assert after[: len(before)] == before and len(after) == 12 and len(set(after)) == 12
    assert run.stats["ran_now"] == 12 - len(before)
    rows = pq.read_table(out / "trajectories.parquet").to_pylist()
    assert sorted(r["rollout_id"] for r in rows) == sorted(f"echo-{i}#{s}" for i in range(6) for s in range(2))
    assert all(r["resolved"] for r in rows)


def test_journal_drops_a_partial_last_line(tmp_path):
    path = tmp_path / "journal.jsonl"
    path.write_text('{"row": {"rollout_id": "a#0"}, "samples": []}\n{"row": {"rollout')
    journal = Journal(path)
    journal.append({"row": {"rollout_id": "b#0"}, "samples": []})
    journal.close()
    assert [e["row"]["rollout_id"] for e in Journal(path).entries()] == ["a#0", "b#0"]
