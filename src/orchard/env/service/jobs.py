"""Exec jobs: admission, per-sandbox order, a global limit, durable results and event-driven waits.

Per-sandbox order and wake-ups come from the store, so they hold across replicas when the store
is shared (Redis): a job takes its place in its sandbox's queue before the submit is answered,
and a wait on any replica wakes when the replica that ran the job stores its result.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Optional

from orchard import errors
from orchard.env.backends.base import Backend, ExecOutcome, ExecSpec
from orchard.env.protocol import ExecRequest
from orchard.env.service.callers import Caller
from orchard.env.service.metrics import Metrics
from orchard.env.service.records import JobRecord
from orchard.env.service.sandboxes import SandboxManager
from orchard.env.service.stores.base import Store, Turn
from orchard.env.service.waits import Waiters
from orchard.env.settings import Settings

log = logging.getLogger("orchard.env")
LONG_COMMAND = 64 * 1024
RESTARTED = "The service restarted before this job finished; its result was lost"
REPLICA_DIED = "Replica {replica} died before this job finished (its heartbeat expired); its result was lost"


def argv_of(command: str | list[str], login_shell: bool) -> list[str]:
    """A string runs under bash (a login shell on request); a list is an argv as it is."""
    if isinstance(command, list):
        return list(command)
    if login_shell:
        return ["bash", "--login", "-c", f"[ -f ~/.bashrc ] && . ~/.bashrc >/dev/null 2>&1\n{command}"]
    return ["bash", "-c", command]


class JobRunner:
    """Queues, runs and remembers exec jobs."""

    def __init__(self, settings: Settings, store: Store, backend: Backend, sandboxes: SandboxManager,
                 metrics: Metrics):
        self.settings, self.store, self.backend, self.sandboxes, self.metrics = (
            settings, store, backend, sandboxes, metrics)
        self.replica_id = settings.replica_id
        self._slots = asyncio.Semaphore(settings.max_concurrent_execs)      # per replica
        self._tasks: dict[str, asyncio.Task] = {}
        self._inflight: dict[str, JobRecord] = {}
        self._pending = 0
        self._missing: dict[str, float] = {}      # replica -> when its heartbeat was first seen gone
        self._closing = False
        sandboxes.on_gone.append(self._sandbox_gone)

    # ------------------------------------------------------------ submit
    async def submit(self, sandbox_id: str, req: ExecRequest, caller: Caller,
                     idempotency_key: Optional[str] = None) -> JobRecord:
        """Record a queued job and start it; a repeated idempotency key returns the first job."""
        await self.sandboxes.get_ready(sandbox_id, caller)
        if idempotency_key:
            known = await self.store.job_by_key(sandbox_id, idempotency_key)
            if known is not None:
                return known
        if self._pending >= self.settings.max_queued_execs:
            self.metrics.rejected.labels("exec_queue").inc()
            raise errors.OverloadedError("Exec queue is full; retry shortly", retry_after=1)
        job = JobRecord(job_id=uuid.uuid4().hex, sandbox_id=sandbox_id, owner=caller.owner, command=req.command,
                        created_at=time.time(), idempotency_key=idempotency_key or None, replica=self.replica_id)
        turn = self.store.turn(sandbox_id, job.job_id, self.settings.per_sandbox_execs, self.settings.lease_seconds)
        await turn.join()                 # before the reply: a later submit on any replica queues behind it
        try:
            stored = await self.store.add_job(job)
        except BaseException:
            await turn.leave()
            raise
        if stored.job_id != job.job_id:   # another replica took the idempotency key first
            await turn.leave()
            return stored
        self._pending += 1
        self._inflight[job.job_id] = job
        self._tasks[job.job_id] = asyncio.create_task(self._run(job, req, turn))
        return job

    async def _run(self, job: JobRecord, req: ExecRequest, turn: Turn) -> None:
        self.metrics.jobs_queued.inc()
        try:
            async with turn, self._slots:
                self.metrics.jobs_queued.dec()
                if job.finished:        # failed while queued (sandbox deleted)
                    return
                await self._execute(job, req)
        finally:
            self._pending -= 1
            self._tasks.pop(job.job_id, None)
            await self._finish(job)
            self._inflight.pop(job.job_id, None)     # only once stored: until then this replica serves it

    async def _execute(self, job: JobRecord, req: ExecRequest) -> None:
        job.status, job.started_at = "running", time.time()     # this replica serves it from memory until it ends
        if self.store.shared and not await self._announce(job):
            return
        self.metrics.jobs_running.inc()
        spec = ExecSpec(argv=await self._argv(job, req), cwd=req.cwd, env=req.env or {},
                        timeout=float(req.timeout_seconds or self.settings.exec_timeout),
                        output_limit=self.settings.output_limit)
        try:
            outcome = await self.backend.exec(job.sandbox_id, spec)
        except errors.OrchardError as e:
            outcome = ExecOutcome(exit_code=None, error=e.detail)
        except Exception as e:
            log.exception("exec %s failed", job.job_id)
            outcome = ExecOutcome(exit_code=None, error=f"Backend error: {e}")
        finally:
            self.metrics.jobs_running.dec()
        if not job.finished:
            _apply(job, outcome)

    async def _announce(self, job: JobRecord) -> bool:
        """Shared store: record `running` for the other replicas; False when the sandbox was deleted meanwhile."""
        try:
            if await self.store.get_sandbox(job.sandbox_id) is None:
                job.status, job.error = "failed", f"Sandbox {job.sandbox_id} was deleted"
                return False
            await self.store.put_job(job)
        except errors.StoreUnavailableError as e:
            log.warning("job %s runs unannounced: %s", job.job_id, e.detail)
        return True

    async def _argv(self, job: JobRecord, req: ExecRequest) -> list[str]:
        """A long shell command travels as a script file: the kernel caps one argv string at 128 KiB."""
        if not isinstance(req.command, str) or len(req.command) < LONG_COMMAND:
            return argv_of(req.command, req.login_shell)
        path = f"/tmp/.orchard-cmd-{job.job_id}.sh"
        script = f'rm -f -- "{path}"\n{req.command}\n'.encode()
        await self.backend.write_file(job.sandbox_id, path, script, 0o600)
        return ["bash", "--login", path] if req.login_shell else ["bash", path]

    async def _finish(self, job: JobRecord) -> None:
        if not job.finished:
            job.status, job.error = "failed", job.error or "Job was cancelled"
        job.completed_at = job.completed_at or time.time()
        await self._store_result(job)
        self.metrics.jobs.labels(job.status).inc()
        if job.started_at:
            self.metrics.exec_seconds.observe(job.completed_at - job.started_at)
        await self.store.notify(f"job:{job.job_id}")

    async def _store_result(self, job: JobRecord) -> None:
        """A result is stored before anyone but this replica can see it: retry while the store is away."""
        delay = 0.1
        while True:
            try:
                return await self.store.put_job(job)
            except errors.StoreUnavailableError as e:
                if self._closing:
                    log.error("result of job %s lost at shutdown: %s", job.job_id, e.detail)
                    return
                log.warning("result of job %s not stored yet, retrying: %s", job.job_id, e.detail)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _sandbox_gone(self, sandbox_id: str, message: str) -> None:
        for job in self._inflight.values():
            if job.sandbox_id == sandbox_id and not job.finished:
                job.error = message
                if job.status == "queued":
                    job.status = "failed"

    # ------------------------------------------------------------ read
    async def get(self, job_id: str, caller: Caller) -> JobRecord:
        """The caller's job, or 404."""
        job = self._inflight.get(job_id) or await self.store.get_job(job_id)
        if job is None or not caller.may_see(job.owner):
            raise errors.NotFoundError(f"Job {job_id} not found")
        return job

    async def wait(self, job_id: str, caller: Caller, timeout: float) -> JobRecord:
        """Block until the job ends or timeout passes; returns the job as it is then."""
        deadline = time.monotonic() + min(timeout, self.settings.exec_wait_max)
        while True:
            ev = self.store.event(f"job:{job_id}")        # taken before the check: no lost wake-up
            job = await self.get(job_id, caller)
            left = deadline - time.monotonic()
            if job.finished or left <= 0:
                return job
            await Waiters.wait(ev, min(left, self.store.recheck))

    # ------------------------------------------------------------ restart, dead replicas
    async def fail_interrupted(self) -> int:
        """After a restart: fail the jobs this replica left queued or running (all of them unless the store is shared)."""
        failed = 0
        for job in await self.store.unfinished_jobs():
            if not self.store.shared or job.replica == self.replica_id:
                failed += await self._fail_lost(job, RESTARTED)
        return failed

    async def fail_orphans(self) -> int:
        """Fail unfinished jobs of replicas whose heartbeat has been gone for a whole lease (they died)."""
        if not self.store.shared:
            return 0
        jobs = [j for j in await self.store.unfinished_jobs() if j.replica != self.replica_id]
        dead = await self._dead_replicas({j.replica or "" for j in jobs})
        failed = 0
        for job in jobs:
            if (job.replica or "") in dead:
                failed += await self._fail_lost(job, REPLICA_DIED.format(replica=job.replica or "(unknown)"))
        return failed

    async def _dead_replicas(self, replicas: set[str]) -> set[str]:
        """Missing twice a lease apart, so a Redis restart that dropped live heartbeats fails nothing."""
        now, dead = time.monotonic(), set()
        for replica in replicas:
            if replica and await self.store.replica_alive(replica):
                self._missing.pop(replica, None)
            elif now - self._missing.setdefault(replica, now) >= self.settings.lease_seconds:
                dead.add(replica)
        self._missing = {r: t for r, t in self._missing.items() if r in replicas}
        return dead

    async def _fail_lost(self, job: JobRecord, message: str) -> int:
        job.status, job.error, job.completed_at = "failed", message, time.time()
        await self.store.put_job(job)              # a shared store keeps a result that was stored meanwhile
        await self.store.notify(f"job:{job.job_id}")
        log.warning("job %s failed: %s", job.job_id, message)
        return 1

    async def drain(self) -> None:
        """Wait for running jobs (shutdown)."""
        self._closing = True
        if self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)


def _apply(job: JobRecord, outcome: ExecOutcome) -> None:
    job.exit_code = outcome.exit_code
    job.stdout = outcome.stdout.decode("utf-8", "replace")
    job.stderr = outcome.stderr.decode("utf-8", "replace")
    job.stdout_truncated, job.stderr_truncated = outcome.stdout_truncated, outcome.stderr_truncated
    job.error = outcome.error or job.error       # keep "sandbox was deleted" set while it ran
    job.status = "succeeded" if outcome.exit_code == 0 and job.error is None else "failed"
    job.completed_at = time.time()

