"""The service core: one object that wires settings, store, backend and the managers together."""

from __future__ import annotations

import asyncio

from orchard.env.backends.base import Backend
from orchard.env.service.files import FileOps
from orchard.env.service.jobs import JobRunner
from orchard.env.service.lifecycle import Lifecycle
from orchard.env.service.metrics import Metrics
from orchard.env.service.sandboxes import SandboxManager
from orchard.env.service.stores.base import Store
from orchard.env.settings import Settings


class EnvCore:
    """Everything a request handler needs, started and stopped by the app's lifespan."""

    def __init__(self, settings: Settings, backend: Backend, store: Store):
        self.settings, self.backend, self.store = settings, backend, store
        self.metrics = Metrics()
        self.sandboxes = SandboxManager(settings, store, backend, self.metrics)
        self.jobs = JobRunner(settings, store, backend, self.sandboxes, self.metrics)
        self.files = FileOps(settings, backend)
        self.lifecycle = Lifecycle(settings, backend, self.sandboxes, self.jobs)

    async def start(self) -> None:
        """Open state, start the backend, recover from a previous run, start the lifecycle loop."""
        await self.store.open()
        await self.backend.start(self._sandbox_exited)
        await self.lifecycle.recover()
        self.lifecycle.start()
        self._lag_task = asyncio.create_task(self._watch_loop_lag())

    async def stop(self) -> None:
        """Stop background work; sandboxes keep running for the next start to adopt."""
        await self.lifecycle.stop()
        self._lag_task.cancel()
        await asyncio.wait_for(self.sandboxes.drain(), 30)
        for task in list(self.jobs._tasks.values()):
            task.cancel()
        await self.jobs.drain()
        await self.backend.close()
        await self.store.close()

    async def _watch_loop_lag(self, period: float = 0.05) -> None:
        """A busy event loop answers everything late, /health included: measure how late."""
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(period)
            self.metrics.loop_lag.observe(max(0.0, loop.time() - start - period))

    async def _sandbox_exited(self, sandbox_id: str, message: str) -> None:
        await self.sandboxes.mark_failed(sandbox_id, message)
