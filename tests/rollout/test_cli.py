"""`orchard rollout` and `orchard eval` as a user runs them: every part started as its own process."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from orchard.cli import main


def test_rollout_then_eval_from_the_command_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ORCHARD_TOOLS_DIR", str(tmp_path / "tools"))
    out = tmp_path / "run"
    assert main(["rollout", "--tasks", "echo:2", "--samples", "2", "--model", "oracle", "--oracle-error-rate", "0",
                 "--concurrency", "4", "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "4/4 rollouts" in printed and "pass rate 100.0%" in printed and "engine overhead" in printed
    rows = pq.read_table(out / "trajectories.parquet").to_pylist()
    assert len(rows) == 4 and {r["model"] for r in rows} == {"oracle"} and all(r["resolved"] for r in rows)
    assert json.loads((out / "run.json").read_text())["tasks"] == ["echo-0", "echo-1"]
    assert (out / "services" / "proxy.log").exists() and (out / "services" / "proxy-store").is_dir()

    assert main(["eval", str(out)]) == 0
    report = json.loads((out / "eval" / "report.json").read_text())["report"]
    assert report["pass_at_k"] == {"1": 1.0, "2": 1.0} and report["scored"] == 4


def test_run_rollouts_against_a_running_proxy(proxy_url, oracle, tmp_path, monkeypatch):
    from orchard.rollout.engine import EngineConfig
    from orchard.rollout.run import RolloutConfig, run_rollouts

    monkeypatch.setenv("ORCHARD_TOOLS_DIR", str(tmp_path / "tools"))
    oracle.error_rate = 0.0
    run = run_rollouts(RolloutConfig(tasks="echo:2", model="my-teacher", proxy_url=proxy_url,
                                     engine=EngineConfig(out=tmp_path / "run", progress=False)))
    assert [(r["model"], r["resolved"]) for r in run.rows] == [("my-teacher", True)] * 2
    assert not (tmp_path / "run" / "services" / "proxy.log").exists()      # no proxy or model of its own
