"""Embedded SQLite store: records and job results survive a restart (WAL, one file under the state dir).

Queries are tiny and run inline on the event loop: a thread hop would cost more than the
query. What may block on the disk leaves the loop: large job outputs are written through
``asyncio.to_thread``, and WAL checkpoints (the only fsyncs) run in a background thread.
Sandbox records are also kept in memory (this process is the file's only writer), and the
coordination primitives (wake-ups, exec turns) are in-process asyncio ones.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any, Optional

from orchard.env.service.records import JobRecord, SandboxRecord
from orchard.env.service.stores.inprocess import InProcessCoordination

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sandboxes (id TEXT PRIMARY KEY, owner TEXT NOT NULL, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY, sandbox_id TEXT NOT NULL, status TEXT NOT NULL, idem TEXT,
  completed_at REAL, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS images (owner TEXT NOT NULL, name TEXT NOT NULL, PRIMARY KEY (owner, name));
CREATE INDEX IF NOT EXISTS jobs_unfinished ON jobs(status) WHERE status IN ('queued', 'running');
CREATE UNIQUE INDEX IF NOT EXISTS jobs_idem ON jobs(sandbox_id, idem) WHERE idem IS NOT NULL;
"""
_BIG_OUTPUT = 256 * 1024


class SqliteStore(InProcessCoordination):
    """Store on one SQLite file."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = Path(path)
        self._db: Optional[sqlite3.Connection] = None
        self._lock = asyncio.Lock()
        self._records: dict[str, SandboxRecord] = {}
        self._checkpoints: Optional[asyncio.Task] = None

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA wal_autocheckpoint=0")
        db.executescript(_SCHEMA)
        self._db = db
        self._records = {r.sandbox_id: r for r in await self._load_sandboxes()}
        self._checkpoints = asyncio.create_task(self._checkpoint_loop())

    async def close(self) -> None:
        if self._checkpoints is not None:
            self._checkpoints.cancel()
            await asyncio.gather(self._checkpoints, return_exceptions=True)
        if self._db is not None:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._db.close()
            self._db = None

    async def _checkpoint_loop(self, period: float = 2.0) -> None:
        while True:
            await asyncio.sleep(period)
            await asyncio.to_thread(self._checkpoint)

    def _checkpoint(self) -> None:
        with sqlite3.connect(self.path, timeout=30) as db:
            db.execute("PRAGMA wal_checkpoint(PASSIVE)")

    async def _load_sandboxes(self) -> list[SandboxRecord]:
        rows = self.db.execute("SELECT data FROM sandboxes ORDER BY id").fetchall()
        return [SandboxRecord.model_validate_json(r[0]) for r in rows]

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("store is not open")
        return self._db

    async def put_sandbox(self, record: SandboxRecord, *, create: bool = False) -> bool:
        verb = "INSERT OR IGNORE" if create else "INSERT OR REPLACE"
        cur = self.db.execute(f"{verb} INTO sandboxes (id, owner, data) VALUES (?, ?, ?)",
                              (record.sandbox_id, record.owner, record.model_dump_json()))
        if cur.rowcount == 1:
            self._records[record.sandbox_id] = record.model_copy()
        return cur.rowcount == 1

    async def update_sandbox(self, sandbox_id: str, **fields: Any) -> Optional[SandboxRecord]:
        current = self._records.get(sandbox_id)
        if current is None:
            return None
        record = current.model_copy(update=fields)
        await self.put_sandbox(record)
        return record.model_copy()

    async def get_sandbox(self, sandbox_id: str) -> Optional[SandboxRecord]:
        record = self._records.get(sandbox_id)
        return record.model_copy() if record is not None else None    # callers change what they get

    async def list_sandboxes(self, owner: Optional[str] = None) -> list[SandboxRecord]:
        return [r.model_copy() for _, r in sorted(self._records.items()) if owner is None or r.owner == owner]

    async def delete_sandbox(self, sandbox_id: str) -> bool:
        self.db.execute("DELETE FROM sandboxes WHERE id = ?", (sandbox_id,))
        return self._records.pop(sandbox_id, None) is not None

    async def put_image(self, owner: str, name: str) -> None:
        self.db.execute("INSERT OR IGNORE INTO images (owner, name) VALUES (?, ?)", (owner, name))

    async def list_images(self, owner: str) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT name FROM images WHERE owner = ? ORDER BY name", (owner,))]

    async def add_job(self, job: JobRecord) -> JobRecord:
        if job.idempotency_key:          # no await between the check and the write: atomic in this process
            known = await self.job_by_key(job.sandbox_id, job.idempotency_key)
            if known is not None:
                return known
        await self.put_job(job)
        return job

    async def put_job(self, job: JobRecord) -> None:
        args = (job.job_id, job.sandbox_id, job.status, job.idempotency_key, job.completed_at, job.model_dump_json())
        sql = "INSERT OR REPLACE INTO jobs (id, sandbox_id, status, idem, completed_at, data) VALUES (?, ?, ?, ?, ?, ?)"
        if len(job.stdout) + len(job.stderr) > _BIG_OUTPUT:
            async with self._lock:
                await asyncio.to_thread(self.db.execute, sql, args)
        else:
            self.db.execute(sql, args)

    async def get_job(self, job_id: str) -> Optional[JobRecord]:
        row = self.db.execute("SELECT data FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return JobRecord.model_validate_json(row[0]) if row else None

    async def job_by_key(self, sandbox_id: str, key: str) -> Optional[JobRecord]:
        row = self.db.execute("SELECT data FROM jobs WHERE sandbox_id = ? AND idem = ?", (sandbox_id, key)).fetchone()
        return JobRecord.model_validate_json(row[0]) if row else None

    async def unfinished_jobs(self) -> list[JobRecord]:
        rows = self.db.execute("SELECT data FROM jobs WHERE status IN ('queued', 'running')").fetchall()
        return [JobRecord.model_validate_json(r[0]) for r in rows]

    async def prune_jobs(self, completed_before: float) -> int:
        cur = self.db.execute("DELETE FROM jobs WHERE completed_at IS NOT NULL AND completed_at < ?", (completed_before,))
        return cur.rowcount
