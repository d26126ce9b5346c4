"""Sandbox lifecycle: create, wait, heartbeat, delete, list, on top of a store and a backend."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Optional

from orchard import errors
from orchard.env.backends.base import Backend, SandboxSpec
from orchard.env.protocol import CreateSandboxRequest, SandboxInfo
from orchard.env.quantities import parse_cpu, parse_memory
from orchard.env.service.callers import Caller
from orchard.env.service.metrics import Metrics
from orchard.env.service.records import SandboxRecord
from orchard.env.service.stores.base import Store
from orchard.env.service.waits import Waiters
from orchard.env.settings import Settings

log = logging.getLogger("orchard.env")


def snapshot_ref(owner: str, image: str) -> str:
    """The backend's name for an owner's snapshot ('@' never starts a name a caller may send)."""
    return f"@{owner or 'anonymous'}/{image}"


SETTLED = ("ready", "failed", "unschedulable", "not_found")


class SandboxManager:
    """Owns every sandbox record and drives the backend to match it."""

    def __init__(self, settings: Settings, store: Store, backend: Backend, metrics: Metrics):
        self.settings, self.store, self.backend, self.metrics = settings, store, backend, metrics
        self._creating: dict[str, asyncio.Task] = {}
        self._deleting: dict[str, asyncio.Task] = {}
        self._start_gate = asyncio.Semaphore(settings.create_concurrency)
        self.live_count = 0
        self.on_gone: list = []          # callbacks(sandbox_id, message) when a sandbox stops being usable

    # ------------------------------------------------------------ create
    async def create(self, req: CreateSandboxRequest, caller: Caller) -> SandboxRecord:
        """Validate, admit, record as pending and start the backend in the background."""
        spec = self._spec(req)
        self._admit()
        spec.image = await self.backend_image(req.image, caller)
        record = self._record(req, spec, caller)
        if not await self.store.put_sandbox(record, create=True) or spec.sandbox_id in self._deleting:
            raise errors.ConflictError(f"Sandbox {spec.sandbox_id} already exists")
        self.live_count += 1
        self.metrics.sandboxes_live.set(self.live_count)
        task = self._creating[spec.sandbox_id] = asyncio.create_task(self._start(record, spec))
        # a fast start is answered as "ready" at once, which spares the client a /wait round trip
        await asyncio.wait({task}, timeout=self.settings.create_reply_wait)
        return await self.store.get_sandbox(spec.sandbox_id) or record

    def _spec(self, req: CreateSandboxRequest) -> SandboxSpec:
        s = self.settings
        try:
            cpu = parse_cpu(req.cpu or s.default_cpu)
            memory = parse_memory(req.memory or s.default_memory)
            disk = parse_memory(req.disk or s.default_disk)
        except ValueError as e:
            raise errors.RequestError(str(e), status_code=422) from e
        self._within_capacity(cpu, memory)
        endpoint = None
        if req.model_endpoint is not None:
            target = s.resolved_forward(req.model_endpoint.target)
            if target is None:
                allowed = ", ".join(s.forward_allowlist) or "none configured"
                raise errors.RequestError(
                    f"model_endpoint target {req.model_endpoint.target!r} is not allowed (allowlist: {allowed})",
                    status_code=422)
            endpoint = (req.model_endpoint.port, target[0], target[1])
        sid = req.sandbox_id or uuid.uuid4().hex[:12]
        return SandboxSpec(sandbox_id=sid, image=req.image, block_network=req.block_network, cpu=cpu,
                           memory=memory, pids=s.default_pids, disk=disk, model_endpoint=endpoint, created_at=time.time())

    def _within_capacity(self, cpu: float, memory: int) -> None:
        cores, total = self.backend.capacity()
        if cpu > cores or memory > total:
            raise errors.RequestError(
                f"Asked for {cpu:g} cores and {memory} bytes; this service has {cores:g} cores and {total} bytes",
                status_code=422)

    async def backend_image(self, image: str, caller: Caller) -> str:
        """A caller's own snapshot resolves to its owner-qualified name; anything else passes through."""
        if image in await self.store.list_images(caller.owner):
            return snapshot_ref(caller.owner, image)
        return image

    async def snapshot(self, sandbox_id: str, image: str, caller: Caller) -> int:
        """Freeze the sandbox into an image only its owner can start (and replace)."""
        record = await self.get_ready(sandbox_id, caller)
        size = await self.backend.snapshot(sandbox_id, snapshot_ref(record.owner, image))
        await self.store.put_image(record.owner, image)
        return size

    async def images_of(self, owner: str) -> list[str]:
        """The snapshot images an owner may start."""
        return await self.store.list_images(owner)

    def _admit(self) -> None:
        if self.live_count >= self.settings.max_sandboxes:
            self.metrics.rejected.labels("max_sandboxes").inc()
            raise errors.OverloadedError(f"Sandbox limit reached ({self.settings.max_sandboxes})", retry_after=5)
        if len(self._creating) >= self.settings.max_pending_creates:
            self.metrics.rejected.labels("pending_creates").inc()
            raise errors.OverloadedError("Too many sandboxes starting; retry shortly", retry_after=1)

    def _record(self, req: CreateSandboxRequest, spec: SandboxSpec, caller: Caller) -> SandboxRecord:
        s = self.settings
        ttl = min(req.ttl_seconds or s.ttl_seconds, s.max_ttl_seconds)
        endpoint = (req.model_endpoint.port, req.model_endpoint.target) if req.model_endpoint else None
        return SandboxRecord(
            sandbox_id=spec.sandbox_id, owner=caller.owner, namespace=s.namespace, image=req.image,
            block_network=req.block_network, cpu=req.cpu or s.default_cpu, memory=req.memory or s.default_memory,
            timeout=req.timeout or s.ready_timeout, created_at=spec.created_at,
            expires_at=spec.created_at + ttl, ttl_seconds=ttl, model_endpoint=endpoint,
            backend_image=spec.image if spec.image != req.image else None, replica=s.replica_id)

    async def _start(self, record: SandboxRecord, spec: SandboxSpec) -> None:
        sid = spec.sandbox_id
        try:
            await asyncio.wait_for(self._gated_create(spec), record.timeout)
            status, message = "ready", None
        except asyncio.TimeoutError:
            status, message = "failed", f"Sandbox did not start within {record.timeout}s"
        except errors.NotFoundError as e:
            mine = ", ".join(await self.images_of(record.owner)) or "none"
            status, message = "failed", f"{e.detail} (your snapshots: {mine})"
        except errors.OrchardError as e:
            status, message = "failed", e.detail
        except Exception as e:  # a backend bug must not leave the sandbox pending forever
            log.exception("create %s failed", sid)
            status, message = "failed", f"Backend error: {e}"
        finally:
            self._creating.pop(sid, None)
        await self._settle(record, spec, status, message)

    async def _gated_create(self, spec: SandboxSpec) -> None:
        async with self._start_gate:
            if spec.sandbox_id in self._deleting:      # deleted while it queued: never start it
                raise errors.SandboxFailedError("Sandbox was deleted before it started")
            await self.backend.create(spec)

    async def _settle(self, record: SandboxRecord, spec: SandboxSpec, status: str, message: Optional[str]) -> None:
        self.metrics.sandboxes_created.labels(status).inc()
        if status == "ready":
            self.metrics.create_seconds.observe(time.time() - spec.created_at)
        current = None
        if spec.sandbox_id not in self._deleting:      # an update never brings a deleted record back
            current = await self.store.update_sandbox(spec.sandbox_id, status=status, status_message=message,
                                                      ready_at=time.time() if status == "ready" else None)
        if current is None:                            # deleted while starting
            if status == "ready":
                await self.backend.delete(spec.sandbox_id)
            return
        if status != "ready":
            asyncio.create_task(self.backend.delete(spec.sandbox_id))
        await self.store.notify(f"sandbox:{spec.sandbox_id}")

    # ------------------------------------------------------------ read
    async def get(self, sandbox_id: str, caller: Caller) -> SandboxRecord:
        """The caller's sandbox, or 404."""
        record = await self.store.get_sandbox(sandbox_id)
        if record is None or not caller.may_see(record.owner):
            raise errors.SandboxNotFoundError(f"Sandbox {sandbox_id} not found")
        return record

    async def get_ready(self, sandbox_id: str, caller: Caller) -> SandboxRecord:
        """The caller's sandbox if it can run things now; 404 when unknown, dead or deleted."""
        record = await self.get(sandbox_id, caller)
        if record.status == "pending":       # let work queue behind a starting sandbox
            await self.wait(sandbox_id, caller, record.timeout)
            record = await self.get(sandbox_id, caller)
        if record.status == "ready" and sandbox_id not in self._deleting:
            return record
        raise errors.SandboxNotFoundError(
            f"Sandbox {sandbox_id} is not running (status {record.status}: {record.status_message or ''})".rstrip(": "))

    async def wait(self, sandbox_id: str, caller: Caller, timeout: float) -> SandboxInfo:
        """Block until the sandbox is ready or failed; 408 when the wait runs out."""
        deadline = time.monotonic() + timeout
        while True:
            ev = self.store.event(f"sandbox:{sandbox_id}")     # taken before the check: no lost wake-up
            record = await self.get(sandbox_id, caller)
            if record.status in SETTLED:
                return record.info()
            left = deadline - time.monotonic()
            if left <= 0:
                raise errors.SandboxTimeoutError(f"Sandbox {sandbox_id} did not become ready within {timeout:g}s")
            await Waiters.wait(ev, min(left, self.store.recheck))

    async def list(self, caller: Caller, status: Optional[str] = None) -> list[SandboxInfo]:
        """The caller's sandboxes (all of them for admins)."""
        records = await self.store.list_sandboxes(None if caller.admin else caller.owner)
        return [r.info() for r in records if status is None or r.status == status]

    # ------------------------------------------------------------ change
    async def heartbeat(self, sandbox_id: str, caller: Caller) -> SandboxRecord:
        """Refresh liveness and, when allowed, push the TTL out."""
        record = await self.get(sandbox_id, caller)
        now = time.time()
        fields: dict = {"last_heartbeat": now}
        if self.settings.heartbeat_extends_ttl:
            cap = record.created_at + self.settings.max_ttl_seconds
            fields["expires_at"] = min(max(record.expires_at, now + record.ttl_seconds), cap)
        updated = await self.store.update_sandbox(sandbox_id, **fields)     # never clobbers a concurrent status change
        if updated is None:
            raise errors.SandboxNotFoundError(f"Sandbox {sandbox_id} not found")
        return updated

    async def delete(self, sandbox_id: str, caller: Caller, reason: str = "request") -> None:
        """Forget the record now and tear the sandbox down in the background (idempotent)."""
        record = await self.store.get_sandbox(sandbox_id)
        if record is None or not caller.may_see(record.owner) or sandbox_id in self._deleting:
            return
        if not await self.store.delete_sandbox(sandbox_id):      # another replica deleted it first and tears it down
            return
        self.live_count = max(0, self.live_count - 1)
        self.metrics.sandboxes_live.set(self.live_count)
        self.metrics.sandboxes_deleted.labels(reason).inc()
        self._deleting[sandbox_id] = asyncio.create_task(self._teardown(sandbox_id))
        self._gone(sandbox_id, f"Sandbox {sandbox_id} was deleted")

    async def _teardown(self, sandbox_id: str) -> None:
        try:
            creating = self._creating.get(sandbox_id)
            if creating is not None:
                await asyncio.gather(creating, return_exceptions=True)
            await self.backend.delete(sandbox_id)
        except Exception:
            log.exception("teardown of %s failed; reconcile will retry", sandbox_id)
        finally:
            self._deleting.pop(sandbox_id, None)
            await self.store.notify(f"sandbox:{sandbox_id}")

    async def mark_failed(self, sandbox_id: str, message: str) -> None:
        """The backend reports the sandbox died: record it as failed and clean up."""
        record = await self.store.get_sandbox(sandbox_id)
        if record is None or record.status == "failed":
            return
        if await self.store.update_sandbox(sandbox_id, status="failed", status_message=message) is None:
            return
        log.warning("sandbox %s failed: %s", sandbox_id, message)
        await self.store.notify(f"sandbox:{sandbox_id}")
        self._gone(sandbox_id, message)
        asyncio.create_task(self.backend.delete(sandbox_id))

    def _gone(self, sandbox_id: str, message: str) -> None:
        for callback in self.on_gone:
            callback(sandbox_id, message)

    async def drain(self) -> None:
        """Wait for background creates and teardowns (shutdown)."""
        tasks = list(self._creating.values()) + list(self._deleting.values())
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
