"""The engine end to end on real parts: Orchard Env sandboxes, the built-in harness, the proxy, the scripted oracle."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from orchard.client.aio import AsyncSandboxClient
from orchard.errors import RequestError, ServerError
from orchard.eval import build_report, load_run
from orchard.harnesses.base import Budget
from orchard.rollout.engine import Engine, EngineConfig
from orchard.rollout.gateway import ProxyGateway
from orchard.rollout.harness import AdapterRunner
from orchard.rollout.tasks import SuiteTask, echo_tasks



async def run_engine(env_url, proxy_url, out, tasks, gateway=None, **cfg):
    gateway = gateway or ProxyGateway(proxy_url, upstream="oracle")
    config = EngineConfig(out=out, progress=False, retry_backoff_s=0.0, **cfg)
    async with AsyncSandboxClient(base_url=env_url, auto_cleanup=False) as client:
        try:
            return await Engine(config, tasks, AdapterRunner("minimal", config.sandbox_port, Budget(max_steps=12, timeout_s=300)), gateway, client).run()
        finally:
            await gateway.aclose()


@pytest.fixture
def solved(oracle):
    oracle.error_rate = 0.0
    return oracle


async def test_rollouts_are_scored_and_written_as_a_dataset(env_url, proxy_url, solved, tokenizer, tmp_path):
    tasks = [SuiteTask(t) for t in echo_tasks(3)]
    run = await run_engine(env_url, proxy_url, tmp_path, tasks, samples=2, concurrency=4)
    assert [r["rollout_id"] for r in run.rows] == ["echo-0#0", "echo-1#0", "echo-2#0", "echo-0#1", "echo-1#1", "echo-2#1"]
    assert all(r["resolved"] and r["reward"] == 1.0 and r["failure_kind"] is None for r in run.rows), run.rows[0]
    row = run.rows[0]
    assert row["stop_reason"] == "done" and row["n_calls"] == 4 and row["harness"] == "minimal"
    assert [m["role"] for m in row["messages"]] == ["system", "user"] + ["assistant", "tool"] * 3 + ["assistant"]
    assert json.loads(row["messages"][2]["tool_calls"])[0]["function"]["name"] == "bash"
    # the loss mask is 1 exactly on what the model sampled: the four assistant turns decode to the oracle's words
    sampled = [t for t, m in zip(row["input_ids"], row["loss_mask"]) if m]
    assert "Done: the task is complete." in tokenizer.decode(sampled) and "Write the word" not in tokenizer.decode(sampled)
    parts = row["sandbox_s"] + row["harness_s"] + row["grade_s"] + row["proxy_s"]
    assert abs(row["total_s"] - parts - row["overhead_s"]) < 1e-6 and row["proxy_s"] > 0
    assert run.stats["overhead_fraction"] is not None and run.stats["scored"] == 6

    from datasets import load_dataset
    ds = load_dataset("parquet", data_files={"train": str(tmp_path / "trajectories.parquet")})["train"]
    assert ds.num_rows == 6 and ds[0]["messages"][1]["content"].startswith("Write the word")
    samples = pq.read_table(tmp_path / "samples.parquet").to_pylist()
    assert len(samples) == 24 and all(sum(s["loss_mask"]) == len(s["input_ids"]) - s["prompt_length"] for s in samples)


async def test_flawed_teacher_runs_are_model_failures_not_infra(env_url, proxy_url, oracle, tmp_path):
    oracle.error_rate = 1.0
    try:
        run = await run_engine(env_url, proxy_url, tmp_path, [SuiteTask(t) for t in echo_tasks(2)], concurrency=2)
    finally:
        oracle.error_rate = 0.0
    assert [(r["resolved"], r["reward"], r["failure_kind"]) for r in run.rows] == [(False, 0.0, None)] * 2


async def test_sandbox_that_cannot_be_created_is_an_infra_failure(env_url, proxy_url, solved, tmp_path):
    bad = echo_tasks(1)[0].model_copy(update={"id": "no-image", "image": "/nonexistent/rootfs"})
    run = await run_engine(env_url, proxy_url, tmp_path, [SuiteTask(bad), SuiteTask(echo_tasks(1)[0])], max_attempts=2)
    broken, good = run.rows
    assert broken["failure_kind"] == "sandbox" and broken["attempts"] == 2 and broken["reward"] is None
    assert broken["resolved"] is None and good["resolved"] is True
    report = build_report(load_run(tmp_path))
    assert report["scored"] == 1 and report["resolve_rate"] == 1.0 and report["infra_failures"] == {"sandbox": 1}


class FlakyGateway(ProxyGateway):
    """The real gateway with the proxy answering 502 to the first ``failures`` session requests."""

    def __init__(self, url, failures):
        super().__init__(url, upstream="oracle")
        self.failures = failures

    async def open(self, name):
        if self.failures > 0:
            self.failures -= 1
            raise ServerError("HTTP 502: bad gateway", status_code=502)
        return await super().open(name)


async def test_proxy_502_is_retried_then_recorded(env_url, proxy_url, solved, tmp_path):
    run = await run_engine(env_url, proxy_url, tmp_path / "a", [SuiteTask(echo_tasks(1)[0])],
                           gateway=FlakyGateway(proxy_url, failures=1), max_attempts=3)
    assert run.rows[0]["resolved"] is True and run.rows[0]["attempts"] == 2
    run = await run_engine(env_url, proxy_url, tmp_path / "b", [SuiteTask(echo_tasks(1)[0])],
                           gateway=FlakyGateway(proxy_url, failures=99), max_attempts=3)
    assert run.rows[0]["failure_kind"] == "proxy" and run.rows[0]["attempts"] == 3 and "502" in run.rows[0]["error"]


async def test_upstream_down_is_an_infra_failure(env_url, dead_proxy_url, solved, tmp_path):
    run = await run_engine(env_url, dead_proxy_url, tmp_path, [SuiteTask(echo_tasks(1)[0])], max_attempts=2)
    row = run.rows[0]
    assert row["failure_kind"] == "upstream" and row["reward"] is None and row["attempts"] == 2


async def test_a_finished_run_is_not_overwritten(env_url, proxy_url, solved, tmp_path):
    tasks = [SuiteTask(echo_tasks(1)[0])]
    await run_engine(env_url, proxy_url, tmp_path, tasks)
    with pytest.raises(RequestError, match="--resume"):
        await run_engine(env_url, proxy_url, tmp_path, tasks)
    again = await run_engine(env_url, proxy_url, tmp_path, tasks, resume=True)
    assert again.stats["ran_now"] == 0 and len(again.rows) == 1


async def test_harness_that_cannot_start_is_an_infra_failure(env_url, proxy_url, solved, tmp_path):
    gateway = ProxyGateway(proxy_url, upstream="oracle")
    config = EngineConfig(out=tmp_path, progress=False, retry_backoff_s=0.0, max_attempts=2)
    async with AsyncSandboxClient(base_url=env_url, auto_cleanup=False) as client:
        runner = AdapterRunner("codex", config.sandbox_port)        # not in this tools folder
        run = await Engine(config, [SuiteTask(echo_tasks(1)[0])], runner, gateway, client).run()
    await gateway.aclose()
    row = run.rows[0]
    assert row["failure_kind"] == "harness" and "cannot start" in row["error"] and row["reward"] is None


async def test_shipped_terminal_tasks_solved_by_the_oracle(env_url, proxy_url, oracle, tmp_path):
    from orchard.rollout.demo import pick_tasks
    from orchard.rollout.oracle import oracle_task

    picked = pick_tasks("terminal", 3)
    saved = oracle.tasks
    oracle.tasks, oracle.error_rate = [oracle_task(t) for t in picked], 0.0
    try:
        run = await run_engine(env_url, proxy_url, tmp_path, [SuiteTask(t) for t in picked], concurrency=3)
    finally:
        oracle.tasks = saved
    assert [(r["resolved"], r["failure_kind"]) for r in run.rows] == [(True, None)] * 3, [r["grade_detail"] for r in run.rows]
    assert len({r["group"] for r in run.rows}) == 3


class GraderWithoutImage(SuiteTask):
    """A tests-scored task whose grading image does not exist (the rollout itself runs on `host`)."""

    async def create(self, client, **kwargs):
        return await client.create_sandbox("host", **kwargs)


async def test_grader_that_cannot_grade_is_an_infra_failure(env_url, proxy_url, solved, tmp_path):
    from orchard.tasks.model import TestsScoring

    base = echo_tasks(1)[0]
    task = base.model_copy(update={"image": "/nonexistent/rootfs", "scoring": TestsScoring(command="pytest -q")})
    run = await run_engine(env_url, proxy_url, tmp_path, [GraderWithoutImage(task)], max_attempts=2)
    row = run.rows[0]
    assert row["failure_kind"] == "grader" and "verdict" in row["error"] and row["attempts"] == 2
    assert row["reward"] is None and row["resolved"] is None
