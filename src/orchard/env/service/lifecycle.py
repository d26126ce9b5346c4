"""Background lifecycle: restart recovery, TTL, heartbeat and pending timeouts, reconciliation, replica liveness."""

from __future__ import annotations

import asyncio
import logging
import time

from orchard import errors
from orchard.env.backends.base import Backend, SandboxSpec
from orchard.env.quantities import parse_cpu, parse_memory
from orchard.env.service.callers import ANONYMOUS
from orchard.env.service.jobs import JobRunner
from orchard.env.service.records import SandboxRecord
from orchard.env.service.sandboxes import SandboxManager
from orchard.env.settings import Settings

log = logging.getLogger("orchard.env")


class Lifecycle:
    """Keeps records and the backend in agreement, now and every reconcile_interval."""

    def __init__(self, settings: Settings, backend: Backend, sandboxes: SandboxManager, jobs: JobRunner):
        self.settings, self.backend, self.sandboxes, self.jobs = settings, backend, sandboxes, jobs
        self._task: asyncio.Task | None = None
        self._beats: asyncio.Task | None = None

    @property
    def store(self):
        return self.sandboxes.store

    async def recover(self) -> None:
        """After a (re)start: fail interrupted jobs, re-adopt live sandboxes, fail lost ones."""
        await self.store.beat(self.settings.replica_id, self.settings.lease_seconds)
        failed = await self.jobs.fail_interrupted()
        records = await self.store.list_sandboxes()
        self.sandboxes.live_count = len(records)
        adopted = 0
        for record in records:
            adopted += await self._recover_one(record)
        log.info("recovered: %d sandboxes re-adopted, %d records, %d interrupted jobs failed",
                 adopted, len(records), failed)

    async def _recover_one(self, record: SandboxRecord) -> int:
        if record.status == "pending" and self._mine(record):
            await self.backend.delete(record.sandbox_id)
            await self._fail(record, "The service restarted while the sandbox was starting")
        elif record.status == "ready":
            if await self.backend.adopt(spec_of(record)):
                return 1
            await self._fail(record, "The sandbox was gone after the service restarted")
        return 0

    def _mine(self, record: SandboxRecord) -> bool:
        """Another live replica may be starting a shared store's pending sandbox: leave it to the pending timeout."""
        return not self.store.shared or record.replica == self.settings.replica_id

    async def _fail(self, record: SandboxRecord, message: str) -> None:
        await self.store.update_sandbox(record.sandbox_id, status="failed", status_message=message)

    def start(self) -> None:
        """Run passes in the background until stop(); with a shared store, also heartbeats and the dead-replica sweep."""
        self._task = asyncio.create_task(self._loop())
        if self.store.shared:
            self._beats = asyncio.create_task(self._beat_loop())

    async def stop(self) -> None:
        for task in (self._task, self._beats):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _beat_loop(self) -> None:
        """Renew this replica's heartbeat a few times per lease and fail the jobs of replicas that died."""
        while True:
            try:
                await self.store.beat(self.settings.replica_id, self.settings.lease_seconds)
                await self.jobs.fail_orphans()
            except errors.StoreUnavailableError as e:
                log.warning("heartbeat skipped: %s", e.detail)
            except Exception:
                log.exception("heartbeat or dead-replica sweep failed")
            await asyncio.sleep(self.settings.lease_seconds / 3)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reconcile_interval)
            try:
                await self.run_once()
            except errors.StoreUnavailableError as e:
                log.warning("lifecycle pass cut short: %s", e.detail)
            except Exception:
                log.exception("lifecycle pass failed")

    async def run_once(self) -> None:
        """One pass: expire, time out, reconcile, prune old jobs."""
        now = time.time()
        try:
            records = await self.store.list_sandboxes()
        except errors.StoreUnavailableError as e:      # never act on what we cannot see: nothing is deleted
            log.warning("lifecycle pass skipped: %s", e.detail)
            return
        if self.store.shared:                          # other replicas create and delete too
            self.sandboxes.live_count = len(records)
        for record in records:
            reason = self._expired(record, now)
            if reason:
                log.info("deleting %s: %s", record.sandbox_id, reason)
                await self.sandboxes.delete(record.sandbox_id, ANONYMOUS, reason=reason)
        await self.reconcile({r.sandbox_id: r for r in records}, now)
        await self.store.prune_jobs(now - self.settings.job_retention_seconds)

    def _expired(self, record: SandboxRecord, now: float) -> str:
        s = self.settings
        if now >= record.expires_at:
            return "ttl"
        if record.last_heartbeat is not None and now - record.last_heartbeat > s.heartbeat_timeout:
            return "heartbeat"
        if record.status == "pending" and now - record.created_at > record.timeout + s.pending_buffer:
            return "pending_timeout"
        if record.status == "failed" and now - record.created_at > s.ttl_seconds:
            return "ttl"
        return ""

    async def reconcile(self, records: dict[str, SandboxRecord], now: float) -> None:
        """Delete old unowned sandboxes; mark records whose sandbox vanished. Skip if the backend cannot list."""
        live = await self.backend.list_live()
        if live is None:
            log.warning("backend cannot list sandboxes; reconcile skipped")
            return
        live_ids = {item.sandbox_id for item in live}
        for item in live:
            if item.sandbox_id not in records and now - item.created_at >= self.settings.reconcile_min_age:
                if await self.store.get_sandbox(item.sandbox_id) is not None:
                    continue                   # recorded after this pass read the records (another replica's create)
                log.info("removing unowned sandbox %s", item.sandbox_id)
                await self.backend.delete(item.sandbox_id)
        for sid, record in records.items():
            if record.status == "ready" and sid not in live_ids and sid not in self.sandboxes._creating:
                await self.sandboxes.mark_failed(sid, "The sandbox disappeared from the backend")


def spec_of(record: SandboxRecord) -> SandboxSpec:
    """Rebuild what a record was created with (for adoption after a restart)."""
    endpoint = None
    if record.model_endpoint is not None:
        port, target = record.model_endpoint
        host, _, hport = target.rpartition(":")
        endpoint = (port, host.strip("[]"), int(hport))
    return SandboxSpec(sandbox_id=record.sandbox_id, image=record.backend_image or record.image,
                       block_network=record.block_network,
                       cpu=parse_cpu(record.cpu) if record.cpu else None,
                       memory=parse_memory(record.memory) if record.memory else None,
                       model_endpoint=endpoint, created_at=record.created_at)
