"""Durable recording: append-only JSONL files under the store directory, group-committed, flushed before each reply."""

from __future__ import annotations

import asyncio
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator, Literal, Optional

from orchard.proxy import fastjson

Durability = Literal["fsync", "flush"]
CALLS, SESSIONS = "calls.jsonl", "sessions.jsonl"
Pending = tuple[str, bytes, Optional[str], Optional["asyncio.Future[None]"]]
"""A line waiting to be written: file name, bytes, session id, and the future its writer awaits (if any)."""


class Recorder:
    """Appends records to ``calls.jsonl`` (one ModelCall a line) and ``sessions.jsonl`` (session events).

    ``append`` returns once the line is durable: written and fsynced (``fsync``, survives a machine crash) or
    written to the kernel (``flush``, survives a crash of the proxy). Lines waiting while a write is in progress
    go out together in the next write (group commit), so concurrency costs one fsync per batch, not per call.
    A torn last line (a crash mid-write, never acknowledged) is skipped when reading.
    """

    def __init__(self, store_dir: str | Path, durability: Durability = "fsync"):
        self.dir = Path(store_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = _lock_store(self.dir)
        self.durability = durability
        self.files = {name: open(self.dir / name, "ab", buffering=0) for name in (CALLS, SESSIONS)}
        self.offsets: dict[str, list[tuple[int, int]]] = {}
        """Per session: (offset, length) of each of its lines in calls.jsonl, for reading a session back."""
        for f in self.files.values():
            _end_torn_line(f)
        self._size = self.files[CALLS].seek(0, os.SEEK_END)
        self._pending: list[Pending] = []
        self._writing = False
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="orchard-recorder")
        """fsync mode's own thread: reads of the store on the default executor never hold up a commit."""

    def close(self) -> None:
        self._writer.shutdown(wait=True)
        for f in self.files.values():
            f.close()
        self._lock.close()

    async def append(self, name: str, record: dict[str, Any], session_id: str | None = None,
                     raw: Optional[dict[str, bytes]] = None) -> None:
        """Write one record to ``name`` and return when it is durable.

        ``raw`` holds fields already encoded as JSON (request and reply bodies, often megabytes): they are spliced
        into the line as they are instead of being decoded and encoded again.
        """
        line = encode_line(record, raw, name == CALLS)
        if self.durability == "flush":
            self._write([(name, line, session_id, None)])  # a write to the kernel takes microseconds: no thread hop
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((name, line, session_id, future))
        if not self._writing:
            self._writing = True
            asyncio.get_running_loop().create_task(self._drain())
        await future

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    await asyncio.get_running_loop().run_in_executor(self._writer, self._write, batch)
                except Exception as e:  # every waiter must hear of it, whatever it was
                    _settle(batch, e)
                    continue
                _settle(batch, None)
        finally:
            self._writing = False

    def _write(self, batch: list[Pending]) -> None:
        """One write per file and one fsync per touched file, for the whole batch (runs in a worker thread)."""
        for name in {item[0] for item in batch}:
            lines = [item for item in batch if item[0] == name]
            data = b"".join(item[1] for item in lines)
            self.files[name].write(data)
            if self.durability == "fsync":
                os.fsync(self.files[name].fileno())
            if name == CALLS:
                self._index(lines)

    def _index(self, lines: list[Pending]) -> None:
        for _, line, session_id, _ in lines:
            self.offsets.setdefault(session_id or "", []).append((self._size, len(line)))
            self._size += len(line)

    def read_session_calls(self, session_id: str) -> list[dict[str, Any]]:
        """The recorded calls of one session, in recording order (blocking: call it off the event loop)."""
        out = []
        with open(self.dir / CALLS, "rb") as f:
            for offset, length in self.offsets.get(session_id, []):
                f.seek(offset)
                out.append(json.loads(f.read(length)))
        return out

    def load_index(self) -> Iterator[dict[str, Any]]:
        """Index calls.jsonl after a restart and yield every call record in it."""
        offset = 0
        for line in _lines(self.dir / CALLS):
            record = _parse(line)
            if record is not None:
                self.offsets.setdefault(record.get("session_id", ""), []).append((offset, len(line)))
                yield record
            offset += len(line)


def _lock_store(directory: Path) -> Any:
    """One proxy per store: a second one would interleave call indices and sessions."""
    import fcntl

    from orchard.errors import ConflictError

    handle = open(directory / "lock", "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as e:
        handle.close()
        raise ConflictError(f"the store {directory} is in use by another proxy") from e
    return handle


def load_call(record: dict[str, Any]) -> "ModelCall":
    """A recorded line as a ModelCall; the prompt ids the proxy left inside the raw reply are taken from there."""
    from orchard.records import ModelCall

    if "prompt_token_ids" not in record:
        reply = record.get("reply") if isinstance(record.get("reply"), dict) else {}
        ids = reply.get("prompt_token_ids")
        if ids is None and isinstance(reply.get("choices"), list) and reply["choices"]:
            ids = reply["choices"][0].get("prompt_token_ids")
        record = {**record, "prompt_token_ids": ids if (ids and not record.get("text_only")) else []}
    return ModelCall.model_validate(record)


def encode_line(record: dict[str, Any], raw: Optional[dict[str, bytes]] = None, name_is_calls: bool = False) -> bytes:
    """One JSONL line: the record, plus pre-encoded fields spliced in (re-encoded if they span several lines).

    A call record (``name_is_calls``: its floats are timings and logprobs) goes through orjson unless a logprob is
    not finite; session events (rewards and metadata from the caller, rare) keep the standard library's encoder."""
    head = fastjson.dumps(record, strict=name_is_calls and fastjson.finite(record.get("logprobs")))
    parts = [head[:-1]]
    for key, value in (raw or {}).items():
        if b"\n" in value or b"\r" in value:  # pretty-printed JSON would break the one-record-a-line format
            value = json.dumps(json.loads(value), separators=(",", ":"), ensure_ascii=False).encode()
        parts.append(b',"' + key.encode() + b'":' + value)
    return b"".join(parts) + b"}\n"


def _settle(batch: list[Pending], error: BaseException | None) -> None:
    for *_, future in batch:
        if future is not None and not future.done():
            future.set_exception(error) if error else future.set_result(None)


def _end_torn_line(f: Any) -> None:
    """After a crash mid-write, start the next record on a line of its own."""
    with open(f.name, "rb") as reader:
        if reader.seek(0, os.SEEK_END) > 0:
            reader.seek(-1, os.SEEK_END)
            if reader.read(1) != b"\n":
                f.write(b"\n")


def _lines(path: Path) -> Iterator[bytes]:
    if not path.exists():
        return
    with open(path, "rb") as f:
        yield from f


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None  # a torn last line from a crash mid-write: it was never acknowledged
    return record if isinstance(record, dict) else None


def read_records(store_dir: str | Path, name: str) -> list[dict[str, Any]]:
    """Every intact record of one file of a store (for export and for reloading sessions)."""
    return [r for r in (_parse(line) for line in _lines(Path(store_dir) / name)) if r is not None]
