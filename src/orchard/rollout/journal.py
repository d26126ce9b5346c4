"""The run's append-only journal of finished rollouts: what makes a crashed run resumable."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Iterator


class Journal:
    """One JSON line per finished rollout ({"row": ..., "samples": [...]}), flushed and fsynced on append.

    A line cut short by a crash is ignored on reading and cut off before the next append, so a resumed
    run sees every rollout that finished and never one twice.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self._repair()
        self._fh = open(self.path, "a", encoding="utf-8")
        self._lock = threading.Lock()

    def _repair(self) -> None:
        """Truncate a trailing partial line left by a crash."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end != len(data):
            with open(self.path, "r+b") as fh:
                fh.truncate(end)

    def entries(self) -> Iterator[dict[str, Any]]:
        """Every complete entry, last one wins per rollout_id."""
        seen: dict[str, dict[str, Any]] = {}
        with open(self.path, encoding="utf-8") as fh:
            for line in fh:
                entry = json.loads(line)
                seen[entry["row"]["rollout_id"]] = entry
        return iter(seen.values())

    def append(self, entry: dict[str, Any]) -> None:
        """Write one entry and fsync it (safe from several threads)."""
        line = json.dumps(entry, separators=(",", ":")) + "\n"
        with self._lock:
            self._fh.write(line)
            self._fh.flush()
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()
