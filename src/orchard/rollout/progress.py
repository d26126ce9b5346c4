"""The live progress bar of a rollout run: done/total, pass rate, failures by kind, throughput."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, Optional


class Progress:
    """Counts finished rollouts and shows them with `rich` (or silently counts when disabled)."""

    def __init__(self, total: int, finished: list[dict[str, Any]], enabled: bool = True):
        self.total, self.enabled = total, enabled
        self.scored = self.resolved = self.new = 0
        self.failures: Counter[str] = Counter()
        self.overhead: list[float] = []
        self.proxy: list[float] = []
        self.wall: list[float] = []
        self.t0 = time.monotonic()
        self._bar: Optional[Any] = None
        for row in finished:
            self._count(row)
        self.done = len(finished)

    def _count(self, row: dict[str, Any]) -> None:
        if row["failure_kind"]:
            self.failures[row["failure_kind"]] += 1
            return
        self.scored += 1
        self.resolved += int(bool(row["resolved"]))
        if row["total_s"]:
            self.overhead.append(row["overhead_s"])
            self.proxy.append(row["proxy_s"] or 0.0)
            self.wall.append(row["total_s"])

    def describe(self) -> str:
        rate = f"{100 * self.resolved / self.scored:.0f}%" if self.scored else "-"
        fails = " ".join(f"{k}:{v}" for k, v in sorted(self.failures.items())) or "0"
        minutes = (time.monotonic() - self.t0) / 60
        speed = self.new / minutes if minutes > 0 else 0.0
        return f"pass {rate} | infra failures {fails} | {speed:.1f} rollouts/min"

    def add(self, row: dict[str, Any]) -> None:
        self.done += 1
        self.new += 1
        self._count(row)
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, description=self.describe())

    def summary(self) -> dict[str, Any]:
        return {"total": self.total, "done": self.done, "scored": self.scored, "resolved": self.resolved,
                "pass_rate": self.resolved / self.scored if self.scored else None,
                "infra_failures": dict(self.failures),
                "mean_rollout_s": sum(self.wall) / len(self.wall) if self.wall else None,
                "mean_overhead_s": sum(self.overhead) / len(self.overhead) if self.overhead else None,
                "overhead_fraction": sum(self.overhead) / sum(self.wall) if self.wall and sum(self.wall) else None,
                "proxy_fraction": sum(self.proxy) / sum(self.wall) if self.wall and sum(self.wall) else None}

    def __enter__(self) -> "Progress":
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeElapsedColumn

            self._bar = Bar(TextColumn("rollouts"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            TextColumn("{task.description}"))
            self._bar.start()
            self._task = self._bar.add_task(self.describe(), total=self.total, completed=self.done)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
