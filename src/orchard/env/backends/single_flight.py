"""One lookup per key at a time: concurrent callers share it, and a caller that gives up leaves it to the others."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Generic, TypeVar

T = TypeVar("T")


class SingleFlight(Generic[T]):
    """Runs ``lookup(key)`` once for all concurrent callers of ``run(key, lookup)``; the next call after it ends looks again."""

    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task] = {}

    async def run(self, key: str, lookup: Callable[[str], Awaitable[T]]) -> T:
        task = self._tasks.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(lookup(key))
            self._tasks[key] = task
            task.add_done_callback(lambda done: self._ended(key, done))
        return await asyncio.shield(task)

    def _ended(self, key: str, task: asyncio.Task) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]
        if not task.cancelled():
            task.exception()        # raised to whoever waited; retrieved so asyncio does not log it again

    def cancel(self) -> None:
        """Stop every lookup in progress (at close)."""
        for task in list(self._tasks.values()):
            task.cancel()
