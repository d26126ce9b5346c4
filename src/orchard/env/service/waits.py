"""Event-driven waits: wake everyone waiting on a key when it changes."""

from __future__ import annotations

import asyncio


class Waiters:
    """One asyncio.Event per key; notify() sets it and starts a fresh one."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def event(self, key: str) -> asyncio.Event:
        """The event to wait on; take it *before* checking the state to avoid a lost wake-up."""
        ev = self._events.get(key)
        if ev is None:
            ev = self._events[key] = asyncio.Event()
        return ev

    def notify(self, key: str) -> None:
        """Wake every waiter of key."""
        ev = self._events.pop(key, None)
        if ev is not None:
            ev.set()

    def notify_all(self) -> None:
        """Wake every waiter of every key (after wake-ups may have been lost)."""
        events, self._events = self._events, {}
        for ev in events.values():
            ev.set()

    @staticmethod
    async def wait(ev: asyncio.Event, timeout: float) -> bool:
        """True if woken before timeout."""
        if timeout <= 0:
            return ev.is_set()
        try:
            await asyncio.wait_for(ev.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False
