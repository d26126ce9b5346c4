"""A lifecycle pass reads the records, then lists the backend: a sandbox another replica recorded and started
in between is not an orphan and must not be deleted (the store is asked again before any removal)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from orchard.env.backends.base import LiveSandbox
from orchard.env.service.lifecycle import Lifecycle
from orchard.env.service.records import SandboxRecord
from orchard.env.service.stores import SqliteStore
from orchard.env.settings import Settings


class RacingBackend:
    """Lists one live sandbox whose record another replica writes just before the listing answers."""

    def __init__(self, store: SqliteStore, racing: SandboxRecord | None, orphan: str):
        self.store, self.racing, self.orphan = store, racing, orphan
        self.deleted: list[str] = []

    async def list_live(self) -> list[LiveSandbox]:
        await self.store.put_sandbox(self.racing, create=True)
        started = time.time() - 1
        return [LiveSandbox(self.racing.sandbox_id, started), LiveSandbox(self.orphan, started)]

    async def delete(self, sandbox_id: str) -> None:
        self.deleted.append(sandbox_id)


async def test_a_sandbox_recorded_during_the_pass_is_not_an_orphan(tmp_path):
    store = SqliteStore(tmp_path / "db.sqlite")
    await store.open()
    try:
        now = time.time()
        racing = SandboxRecord(sandbox_id="raced", owner="", namespace="orchard", image="host", created_at=now,
                               expires_at=now + 600, replica="other")
        backend = RacingBackend(store, racing, orphan="orphan")
        sandboxes = SimpleNamespace(store=store, _creating={})
        settings = Settings(state_dir=tmp_path, reconcile_min_age=0)
        lifecycle = Lifecycle(settings, backend, sandboxes, jobs=None)
        await lifecycle.reconcile({}, now)              # the records as read before the other replica's create
        assert backend.deleted == ["orphan"]            # the real orphan goes; the raced one stays
    finally:
        await store.close()
