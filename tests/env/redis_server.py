"""A throwaway redis-server for tests: a free loopback port, its data in a temp dir, killed at the end."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

import pytest

from orchard.env.runner import free_port

REDIS = shutil.which("redis-server")


def need_redis() -> None:
    if REDIS is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server, or `make install`)")


class RedisServer:
    """`redis-server` in the foreground; AOF with fsync on every write, so a SIGKILL loses nothing."""

    def __init__(self, data_dir: Path, port: Optional[int] = None):
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: Optional[subprocess.Popen] = None

    def start(self, timeout: float = 10.0) -> "RedisServer":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.data_dir),
               "--save", "", "--appendonly", "yes", "--appendfsync", "always", "--daemonize", "no",
               "--logfile", str(self.data_dir / "redis.log")]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: {(self.data_dir / 'redis.log').read_text()[-2000:]}")
            if self.ping():
                return self
            time.sleep(0.02)
        raise RuntimeError(f"redis-server not answering on port {self.port} after {timeout}s")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()
