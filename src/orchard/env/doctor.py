"""`orchard env doctor`: find (and remove) what the backend left on the host that no record owns."""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from orchard.env.backends.local import LocalBackend
from orchard.env.settings import Settings


@dataclass
class Leak:
    """Something of one sandbox id left on the host without a live record."""

    sandbox_id: str
    kinds: list[str]          # dir, process, mount, cgroup
    why: str

    def describe(self) -> str:
        return f"{self.sandbox_id}: {', '.join(sorted(self.kinds))} ({self.why})"


def live_records(state_dir: Path) -> dict[str, str]:
    """sandbox id -> status, read from the service's SQLite store (read-only)."""
    db_path = Path(state_dir) / "orchard.db"
    if not db_path.exists():
        return {}
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=10)
    try:
        rows = db.execute("SELECT id, json_extract(data, '$.status') FROM sandboxes").fetchall()
    finally:
        db.close()
    return dict(rows)


def find_leaks(state_dir: Path) -> list[Leak]:
    """Every sandbox id the backend still holds that has no pending/ready record.

    A failed record keeps nothing alive: anything still held for it is a leak too."""
    records = live_records(state_dir)
    backend = LocalBackend(Settings(state_dir=Path(state_dir)))
    leaks = []
    for sid, kinds in sorted(backend.inventory().items()):
        status = records.get(sid)
        if status in ("pending", "ready"):
            continue
        why = "no record" if status is None else f"record is {status}"
        if kinds:
            leaks.append(Leak(sid, sorted(kinds), why))
    return leaks


def settled_leaks(state_dir: Path, settle: float = 30.0) -> list[str]:
    """Leaks once background teardown had up to `settle` seconds to finish (deletes answer before it ends)."""
    deadline = time.monotonic() + settle
    while True:
        leaks = [leak.describe() for leak in find_leaks(state_dir)]
        if not leaks or time.monotonic() > deadline:
            return leaks
        time.sleep(0.2)


async def remove_leaks(state_dir: Path, leaks: list[Leak]) -> None:
    """Tear down each leaked sandbox as a delete would."""
    backend = LocalBackend(Settings(state_dir=Path(state_dir)))
    for leak in leaks:
        await backend.delete(leak.sandbox_id)


def main(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir or Settings().state_dir)
    leaks = find_leaks(state_dir)
    if leaks and args.fix:
        asyncio.run(remove_leaks(state_dir, leaks))
        time.sleep(0.2)
        remaining = find_leaks(state_dir)
    else:
        remaining = leaks
    report = {"state_dir": str(state_dir), "leaks": [leak.describe() for leak in leaks],
              "fixed": bool(args.fix and leaks), "remaining": [leak.describe() for leak in remaining]}
    print(json.dumps(report, indent=2))
    return 1 if remaining else 0
