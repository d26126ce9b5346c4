"""Coordination inside one process: the wake-ups, exec turns and heartbeats of a store no other replica shares."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Optional

from orchard.env.service.waits import Waiters


class InProcessCoordination:
    """The coordination half of the Store protocol with asyncio primitives (mixed into SqliteStore)."""

    shared = False
    recheck = math.inf        # an in-process wake-up is never lost

    def __init__(self) -> None:
        self._waiters = Waiters()
        self._gates: dict[str, _Gate] = {}
        self._beats: dict[str, float] = {}

    def event(self, key: str) -> asyncio.Event:
        return self._waiters.event(key)

    async def notify(self, key: str) -> None:
        self._waiters.notify(key)

    def turn(self, sandbox_id: str, holder: str, slots: int, lease: float) -> "LocalTurn":
        return LocalTurn(self._gates, sandbox_id, slots)

    async def beat(self, replica_id: str, lease: float) -> None:
        self._beats[replica_id] = time.monotonic() + lease

    async def replica_alive(self, replica_id: str) -> bool:
        return self._beats.get(replica_id, 0.0) > time.monotonic()


class _Gate:
    """A sandbox's semaphore and how many turns use it (dropped when none does)."""

    def __init__(self, slots: int) -> None:
        self.semaphore = asyncio.Semaphore(slots)
        self.users = 0


class LocalTurn:
    """A place in a sandbox's FIFO semaphore; the order of entry is the order of submission."""

    def __init__(self, gates: dict[str, _Gate], sandbox_id: str, slots: int):
        self._gates, self._sandbox_id, self._slots = gates, sandbox_id, slots
        self._gate: Optional[_Gate] = None

    async def join(self) -> None:
        """Nothing to do: tasks reach the semaphore in the order they were created."""

    async def leave(self) -> None:
        """Nothing to do: a place is only taken on entry."""

    async def __aenter__(self) -> "LocalTurn":
        gate = self._gates.get(self._sandbox_id)
        if gate is None:
            gate = self._gates[self._sandbox_id] = _Gate(self._slots)
        gate.users += 1
        self._gate = gate
        try:
            await gate.semaphore.acquire()
        except BaseException:
            self._drop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._gate.semaphore.release()
        self._drop()

    def _drop(self) -> None:
        gate, self._gate = self._gate, None
        gate.users -= 1
        if gate.users == 0 and self._gates.get(self._sandbox_id) is gate:
            del self._gates[self._sandbox_id]
