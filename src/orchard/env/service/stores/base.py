"""The store protocol every state backend implements: records, jobs, and the coordination of replicas."""

from __future__ import annotations

import asyncio
from typing import Any, Optional, Protocol

from orchard.env.service.records import JobRecord, SandboxRecord


class Turn(Protocol):
    """One job's place in a sandbox's exec queue: join at submission, hold while running.

    ``async with turn:`` waits until the job is among the first ``slots`` live holders of its
    sandbox, keeps its lease alive while held and leaves the queue on exit.
    """

    async def join(self) -> None:
        """Take a place in the queue now, so execs start in submission order (optional)."""

    async def leave(self) -> None:
        """Give up a place that will never be used (an idempotent repeat)."""

    async def __aenter__(self) -> "Turn": ...
    async def __aexit__(self, *exc: object) -> None: ...


class Store(Protocol):
    """Where state lives. Every method may raise ``errors.StoreUnavailableError`` when the store is unreachable."""

    shared: bool          # True when other replicas read and write the same state (Redis)
    recheck: float        # longest a wait trusts its wake-up alone before looking again (lossy wake-ups)

    async def open(self) -> None: ...
    async def close(self) -> None: ...

    # ------------------------------------------------------------ sandboxes
    async def put_sandbox(self, record: SandboxRecord, *, create: bool = False) -> bool:
        """Write a record; with create=True only if the id is new (False when it exists)."""

    async def update_sandbox(self, sandbox_id: str, **fields: Any) -> Optional[SandboxRecord]:
        """Change some fields of an existing record atomically; None (and nothing written) when it is gone."""

    async def get_sandbox(self, sandbox_id: str) -> Optional[SandboxRecord]: ...
    async def list_sandboxes(self, owner: Optional[str] = None) -> list[SandboxRecord]: ...

    async def delete_sandbox(self, sandbox_id: str) -> bool:
        """Forget a record; True only for the one call that removed it."""

    async def put_image(self, owner: str, name: str) -> None:
        """Remember that `owner` has a snapshot image called `name`."""

    async def list_images(self, owner: str) -> list[str]: ...

    # ------------------------------------------------------------ jobs
    async def add_job(self, job: JobRecord) -> JobRecord:
        """Store a new job and return it; when its idempotency key is taken on its sandbox, return that job instead."""

    async def put_job(self, job: JobRecord) -> None:
        """Write a job (a shared store never overwrites a finished job: the first result reported stays)."""

    async def get_job(self, job_id: str) -> Optional[JobRecord]: ...
    async def job_by_key(self, sandbox_id: str, key: str) -> Optional[JobRecord]: ...
    async def unfinished_jobs(self) -> list[JobRecord]: ...
    async def prune_jobs(self, completed_before: float) -> int: ...

    # ------------------------------------------------------------ coordination
    def event(self, key: str) -> asyncio.Event:
        """Set when `key` is next notified on any replica; take it *before* checking the state it guards."""

    async def notify(self, key: str) -> None:
        """Wake the waiters of `key` on every replica (best effort: never raises)."""

    def turn(self, sandbox_id: str, holder: str, slots: int, lease: float) -> Turn:
        """A place for `holder` in the sandbox's queue, at most `slots` holders at once, freed `lease` s after a crash."""

    async def beat(self, replica_id: str, lease: float) -> None:
        """Say that this replica is alive for the next `lease` seconds."""

    async def replica_alive(self, replica_id: str) -> bool:
        """Whether the replica's last heartbeat is still within its lease."""
