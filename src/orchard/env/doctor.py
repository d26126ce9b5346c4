"""`orchard env doctor`: find (and remove) what the backend holds that no record owns."""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from pydantic import ValidationError

from orchard import errors
from orchard.env.backends.base import Backend, LiveSandbox
from orchard.env.backends.local import LocalBackend
from orchard.env.settings import Settings

OWNED = ("pending", "ready")      # record statuses that keep a sandbox alive


@dataclass
class Leak:
    """Something of one sandbox id left on the host without a live record."""

    sandbox_id: str
    kinds: list[str]          # local: dir, process, mount, cgroup; container: container; kubernetes: pod
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


async def redis_records(settings: Settings) -> dict[str, str]:
    """sandbox id -> status, read through the Redis store's own listing (nothing is written)."""
    from orchard.env.service.stores.redis import RedisStore
    store = RedisStore(settings.redis_url or "", prefix=settings.redis_prefix)
    await store.open()
    try:
        return {r.sandbox_id: r.status for r in await store.list_sandboxes()}
    finally:
        await store.close()


def store_records(settings: Settings) -> dict[str, str]:
    """sandbox id -> status from the store the settings name."""
    if settings.store == "redis":
        return asyncio.run(redis_records(settings))
    return live_records(Path(settings.state_dir))


def _why(status: Optional[str]) -> str:
    return "no record" if status is None else f"record is {status}"


def find_leaks(state_dir: Path, records: Optional[dict[str, str]] = None) -> list[Leak]:
    """Local backend: every sandbox id still held on this host that has no pending/ready record.

    A failed record keeps nothing alive: anything still held for it is a leak too."""
    records = live_records(state_dir) if records is None else records
    backend = LocalBackend(Settings(state_dir=Path(state_dir)))
    leaks = []
    for sid, kinds in sorted(backend.inventory().items()):
        status = records.get(sid)
        if status not in OWNED and kinds:
            leaks.append(Leak(sid, sorted(kinds), _why(status)))
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


def sort_live(live: list[LiveSandbox], records: dict[str, str], min_age: float,
              kind: str, now: float) -> tuple[list[Leak], list[str]]:
    """(leaks, young ids): unowned sandboxes, those younger than min_age set apart (maybe being created)."""
    leaks, young = [], []
    for sb in sorted(live, key=lambda s: s.sandbox_id):
        status = records.get(sb.sandbox_id)
        if status in OWNED:
            continue
        if now - sb.created_at < min_age:
            young.append(sb.sandbox_id)
        else:
            leaks.append(Leak(sb.sandbox_id, [kind], _why(status) + ("" if sb.alive else ", not running")))
    return leaks, young


async def _noop_exit(sandbox_id: str, message: str) -> None:
    """The doctor follows no sandbox: exits the backend reports are ignored."""


async def remote_check(settings: Settings, records: dict[str, str], min_age: float,
                       fix: bool, settle: float = 60.0) -> dict[str, Any]:
    """Container or Kubernetes backend: compare its labelled listing with the records; remove leaks on fix."""
    backend = _make_backend(settings)
    await backend.start(_noop_exit)
    try:
        leaks, young = await _listed_leaks(backend, settings, records, min_age)
        remaining = leaks
        if fix and leaks:
            for leak in leaks:
                await backend.delete(leak.sandbox_id)
            remaining = await _still_listed(backend, settings, records, leaks, settle)
        return {"leaks": leaks, "young": young, "remaining": remaining}
    finally:
        await backend.close()


async def _still_listed(backend: Backend, settings: Settings, records: dict[str, str], removed: list[Leak],
                        settle: float) -> list[Leak]:
    """The removed leaks the backend still lists after up to `settle` seconds (a pod terminates a while)."""
    ids = {leak.sandbox_id for leak in removed}
    deadline = time.monotonic() + settle
    while True:
        again, _ = await _listed_leaks(backend, settings, records, 0.0)
        remaining = [leak for leak in again if leak.sandbox_id in ids]
        if not remaining or time.monotonic() > deadline:
            return remaining
        await asyncio.sleep(0.5)


async def _listed_leaks(backend: Backend, settings: Settings, records: dict[str, str],
                        min_age: float) -> tuple[list[Leak], list[str]]:
    live = await backend.list_live()
    if live is None:
        raise errors.BackendError(f"The {settings.backend} backend cannot list its sandboxes")
    kind = "pod" if settings.backend == "kubernetes" else "container"
    return sort_live(live, records, min_age, kind, time.time())


def _make_backend(settings: Settings) -> Backend:
    if settings.backend == "kubernetes":
        from orchard.env.backends.kubernetes import KubernetesBackend
        return KubernetesBackend(settings)
    from orchard.env.backends.container import ContainerBackend
    return ContainerBackend(settings)


def doctor_settings(args: argparse.Namespace) -> Settings:
    """Settings from ORCHARD_* variables, the flags given overriding them."""
    overrides = {key: getattr(args, key, None) for key in ("state_dir", "backend", "store", "redis_url")}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if getattr(args, "min_age", None) is not None:
        overrides["reconcile_min_age"] = args.min_age
    try:
        return Settings(**overrides)
    except ValidationError as e:
        raise errors.RequestError(f"orchard env doctor: bad settings: {e}") from e


def local_check(settings: Settings, records: dict[str, str], fix: bool) -> dict[str, Any]:
    """Local backend: host-level inventory (dirs, processes, mounts, cgroups) against the records."""
    state_dir = Path(settings.state_dir)
    leaks = find_leaks(state_dir, records)
    remaining = leaks
    if fix and leaks:
        asyncio.run(remove_leaks(state_dir, leaks))
        time.sleep(0.2)
        remaining = find_leaks(state_dir, records)
    return {"leaks": leaks, "young": [], "remaining": remaining}


def run(settings: Settings, fix: bool) -> dict[str, Any]:
    """The doctor's report for the backend and store the settings name."""
    records = store_records(settings)
    if settings.backend == "local":
        found = local_check(settings, records, fix)
        age_note = "local: every unowned sandbox is reported (run it while the service is idle or stopped)"
    else:
        found = asyncio.run(remote_check(settings, records, settings.reconcile_min_age, fix))
        age_note = (f"sandboxes younger than {settings.reconcile_min_age:g}s (reconcile_min_age) are not "
                    "reported: they may be being created")
    return {"backend": settings.backend, "store": settings.store, "state_dir": str(settings.state_dir),
            "records": len(records), "min_age": age_note,
            "young": found["young"], "leaks": [leak.describe() for leak in found["leaks"]],
            "fixed": bool(fix and found["leaks"]),
            "remaining": [leak.describe() for leak in found["remaining"]]}


def main(args: argparse.Namespace) -> int:
    try:
        report = run(doctor_settings(args), bool(args.fix))
    except errors.OrchardError as e:
        print(f"error: {e.detail}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2))
    return 1 if report["remaining"] else 0
