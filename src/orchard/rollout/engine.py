"""The rollout engine: tasks x samples through sandbox, harness, proxy and grader, into a resumable dataset."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit, urlunsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field

from orchard.errors import OrchardError, RequestError
from orchard.rollout.journal import Journal
from orchard.rollout.parts import Gateway, Grade, HarnessRunner, RolloutTask, Session, SessionRecord
from orchard.rollout.progress import Progress
from orchard.rollout.schema import empty_row, write_tables
from orchard.rollout.trace import messages_of, samples_of, stats_of

log = logging.getLogger("orchard.rollout")

INFRA_ERRORS = (OrchardError, httpx.HTTPError, OSError, asyncio.TimeoutError)


class EngineConfig(BaseModel):
    """How the engine runs (the parts it runs are passed alongside)."""

    model_config = ConfigDict(extra="forbid")

    out: Path = Field(description="Run directory: journal.jsonl, run.json, trajectories.parquet, samples.parquet.")
    samples: int = Field(1, ge=1, description="Rollouts per task (K).")
    concurrency: int = Field(8, ge=1, description="Rollouts in flight at once.")
    resume: bool = Field(False, description="Continue a run whose directory holds a journal; skip finished rollouts.")
    retry_infra: bool = Field(False, description="On resume, run again the rollouts recorded as infrastructure failures.")
    max_attempts: int = Field(3, ge=1, description="Tries per rollout before an infrastructure failure is recorded.")
    retry_backoff_s: float = Field(1.0, ge=0, description="Wait before retry n is n times this.")
    sandbox_port: int = Field(18080, ge=1, le=65535, description="Loopback port inside the sandbox that reaches the proxy.")
    sandbox_ttl_s: int = Field(3600, gt=0, description="Lifetime of a rollout's sandbox (a crashed engine leaks none for longer).")
    cpu: Optional[str] = Field(None, description="CPU limit per sandbox (server default when None).")
    memory: Optional[str] = Field(None, description="Memory limit per sandbox (server default when None).")
    progress: bool = Field(True, description="Show the live progress bar.")


class InfraFailure(Exception):
    """A rollout attempt failed for a reason that is not the model's; ``kind`` names the boundary."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


@dataclass
class RolloutRun:
    """The outcome of run_rollouts: where the dataset is and the run's figures."""

    out: Path
    rows: list[dict[str, Any]]
    stats: dict[str, Any] = field(default_factory=dict)


class _Clock:
    """Seconds per stage of one attempt."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.spent: dict[str, float] = {"sandbox": 0.0, "harness": 0.0, "grader": 0.0, "proxy": 0.0}

    async def stage(self, kind: str, awaitable: Any) -> Any:
        """Await one step, charge its time to ``kind`` and turn infrastructure errors into InfraFailure(kind)."""
        t0 = time.monotonic()
        try:
            return await awaitable
        except INFRA_ERRORS as exc:
            raise InfraFailure(kind, f"{type(exc).__name__}: {exc}") from exc
        finally:
            self.spent[kind] += time.monotonic() - t0


class _LoopLag:
    """How long the engine's event loop was late waking a 50 ms timer, summed: time every rollout waited on the engine."""

    def __init__(self, period: float = 0.05):
        self.period, self.total = period, 0.0

    async def watch(self) -> None:
        while True:
            t = time.monotonic()
            await asyncio.sleep(self.period)
            self.total += max(0.0, time.monotonic() - t - self.period)


def in_sandbox_url(base_url: str, port: int) -> str:
    """The session's base URL with the proxy's host:port replaced by the sandbox's forwarded loopback port."""
    parts = urlsplit(base_url)
    return urlunsplit((parts.scheme, f"127.0.0.1:{port}", parts.path, parts.query, parts.fragment))


class Engine:
    """Runs every (task, sample) pair once, journaling each finished rollout."""

    def __init__(self, config: EngineConfig, tasks: list[RolloutTask], harness: HarnessRunner, gateway: Gateway,
                 client: Any):
        if not tasks:
            raise RequestError("no tasks to run")
        ids = [t.task_id for t in tasks]
        if len(set(ids)) != len(ids):
            raise RequestError("task ids must be unique")
        self.config, self.tasks, self.harness, self.gateway, self.client = config, tasks, harness, gateway, client

    # ------------------------------------------------------------------ one rollout
    async def _attempt(self, task: RolloutTask, sample: int, attempt: int) -> dict[str, Any]:
        """One try: session, sandbox, setup, harness, record, patch, grade, reward."""
        clock, rid = _Clock(), f"{task.task_id}#{sample}"
        started = time.time()
        session = await clock.stage("proxy", self.gateway.open(rid))
        sandbox = await clock.stage("sandbox", self._create(task))
        try:
            outcome, record, patch, grade = await self._inside(clock, task, sandbox, session)
        finally:
            await self._delete(clock, sandbox)
        await clock.stage("proxy", self.gateway.reward(session, grade.reward))
        return self._row(task, sample, attempt, started, clock, session, record, outcome, patch, grade)

    async def _create(self, task: RolloutTask) -> Any:
        cfg = self.config
        return await task.create(self.client, block_network=True, cpu=cfg.cpu, memory=cfg.memory,
                                 ttl_seconds=cfg.sandbox_ttl_s,
                                 model_endpoint={"port": cfg.sandbox_port, "target": self.gateway.target})

    async def _inside(self, clock: _Clock, task: RolloutTask, sandbox: Any, session: Session):
        """The steps that need the rollout's sandbox."""
        await clock.stage("sandbox", task.setup(sandbox))
        url = in_sandbox_url(session.base_url, self.config.sandbox_port)
        outcome = await clock.stage("harness", self.harness.run(sandbox, session, url, task))
        if outcome.infra:
            raise InfraFailure("harness", outcome.detail)
        record: SessionRecord = await clock.stage("proxy", self.gateway.record(session))
        broken = [c for c in record.calls if c.infra_failure]
        if broken:
            raise InfraFailure("upstream", f"{len(broken)} model call(s) failed upstream: {broken[0].error}")
        patch = await clock.stage("sandbox", collect_patch(sandbox, task.workdir))
        grade: Grade = await clock.stage("grader", task.grade(self.client, sandbox, patch))
        return outcome, record, patch, grade

    async def _delete(self, clock: _Clock, sandbox: Any) -> None:
        try:
            await clock.stage("sandbox", sandbox.delete())
        except InfraFailure as exc:  # the TTL reaps it; the rollout's result stands
            log.warning("could not delete sandbox %s: %s", getattr(sandbox, "sandbox_id", "?"), exc.detail)

    def _row(self, task, sample, attempt, started, clock, session, record, outcome, patch, grade) -> dict[str, Any]:
        row = self._base_row(task, sample, attempt, started)
        row.update(messages=messages_of(record), reward=grade.reward, resolved=grade.resolved,
                   stop_reason=outcome.stop_reason, error=outcome.detail or None, patch=patch,
                   grade_detail=grade.detail, session_id=session.session_id, **stats_of(record))
        total = time.monotonic() - clock.start
        spent = clock.spent
        row.update(total_s=total, sandbox_s=spent["sandbox"], harness_s=spent["harness"], grade_s=spent["grader"],
                   proxy_s=spent["proxy"], overhead_s=max(0.0, total - sum(spent.values())))
        return {"row": row, "samples": samples_of(record, row["rollout_id"], task.task_id, grade.reward)}

    def _base_row(self, task: RolloutTask, sample: int, attempt: int, started: float) -> dict[str, Any]:
        row = empty_row()
        row.update(rollout_id=f"{task.task_id}#{sample}", task_id=task.task_id, group=task.group, sample=sample,
                   harness=self.harness.name, model=self.gateway.upstream, instruction=task.instruction,
                   attempts=attempt, started_at=started)
        return row

    async def rollout(self, task: RolloutTask, sample: int) -> dict[str, Any]:
        """One rollout with bounded retries; an infrastructure failure that persists becomes a record."""
        failure = InfraFailure("engine", "not run")
        for attempt in range(1, self.config.max_attempts + 1):
            try:
                return await self._attempt(task, sample, attempt)
            except InfraFailure as exc:
                failure = exc
                log.info("rollout %s#%d attempt %d: %s", task.task_id, sample, attempt, exc)
            except Exception as exc:  # a bug in a part: record it, never kill the whole run
                failure = InfraFailure("engine", "".join(traceback.format_exception(exc))[-2000:])
                break
            if attempt < self.config.max_attempts:
                await asyncio.sleep(self.config.retry_backoff_s * attempt)
        return self._failed(task, sample, attempt, failure)

    def _failed(self, task: RolloutTask, sample: int, attempts: int, failure: InfraFailure) -> dict[str, Any]:
        row = self._base_row(task, sample, attempts, time.time())
        row.update(failure_kind=failure.kind, error=failure.detail)
        return {"row": row, "samples": []}

    # ------------------------------------------------------------------ the run
    def plan(self) -> list[tuple[RolloutTask, int]]:
        """Every (task, sample), sample-major so early results cover many tasks."""
        return [(t, s) for s in range(self.config.samples) for t in self.tasks]

    async def run(self) -> RolloutRun:
        journal = self._open_journal()
        done = {e["row"]["rollout_id"]: e for e in journal.entries()}
        keep = {rid for rid, e in done.items() if not (self.config.retry_infra and e["row"]["failure_kind"])}
        todo = [(t, s) for t, s in self.plan() if f"{t.task_id}#{s}" not in keep]
        progress = Progress(len(self.plan()), [done[r]["row"] for r in keep], enabled=self.config.progress)
        sem = asyncio.Semaphore(self.config.concurrency)

        async def worker(task: RolloutTask, sample: int) -> None:
            async with sem:
                entry = await self.rollout(task, sample)
            await asyncio.to_thread(journal.append, entry)   # the fsync must not stall the other rollouts
            done[entry["row"]["rollout_id"]] = entry
            progress.add(entry["row"])

        await self._prepare_images([t for t, _ in todo])
        t0, lag = time.monotonic(), _LoopLag()
        monitor = asyncio.ensure_future(lag.watch())
        try:
            with progress:
                await asyncio.gather(*(worker(t, s) for t, s in todo))
        finally:
            monitor.cancel()
            journal.close()
        return self._finish(done, progress, time.monotonic() - t0, len(todo), lag.total)

    async def _prepare_images(self, tasks: list[RolloutTask]) -> None:
        """Build each missing task image once, before rollouts race to build it (tasks without ``prepare`` skip)."""
        firsts = {t.image: t for t in reversed(tasks) if hasattr(t, "prepare")}
        for image, task in firsts.items():
            try:
                await task.prepare(self.client)
            except INFRA_ERRORS as exc:  # each rollout will retry and record it
                log.warning("could not prepare image %s: %s", image, exc)

    def _open_journal(self) -> Journal:
        out = self.config.out
        out.mkdir(parents=True, exist_ok=True)
        path, meta = out / "journal.jsonl", out / "run.json"
        identity = {"harness": self.harness.name, "model": self.gateway.upstream}
        if path.exists() and path.stat().st_size and not self.config.resume:
            raise RequestError(f"{out} already holds a run; pass --resume to continue it or choose another --out")
        if meta.exists() and self.config.resume:
            old = json.loads(meta.read_text())
            if {k: old.get(k) for k in identity} != identity:
                raise RequestError(f"cannot resume {out}: it was run with {old}, not {identity}")
        meta.write_text(json.dumps({**identity, "samples": self.config.samples,
                                    "tasks": [t.task_id for t in self.tasks]}, indent=1))
        return Journal(path)

    def _finish(self, done: dict[str, dict], progress: Progress, wall: float, ran: int, lag: float) -> RolloutRun:
        order = {f"{t.task_id}#{s}": i for i, (t, s) in enumerate(self.plan())}
        entries = sorted((e for rid, e in done.items() if rid in order), key=lambda e: order[e["row"]["rollout_id"]])
        rows = [e["row"] for e in entries]
        write_tables(rows, [s for e in entries for s in e["samples"]], self.config.out)
        stats = {**progress.summary(), "wall_s": wall, "ran_now": ran, "loop_lag_fraction": lag / wall if wall else None,
                 "rollouts_per_min": 60 * ran / wall if wall > 0 and ran else 0.0}
        (self.config.out / "stats.json").write_text(json.dumps(stats, indent=1))
        return RolloutRun(self.config.out, rows, stats)


async def collect_patch(sandbox: Any, workdir: str) -> str:
    """The work tree's changes against HEAD as a git diff ('' when the directory is not a git work tree)."""
    cmd = "git add -A >/dev/null 2>&1 && git -c core.quotepath=off diff --cached --binary HEAD"
    result = await sandbox.exec(cmd, cwd=workdir, timeout=120)
    return result.stdout if result.exit_code == 0 else ""
