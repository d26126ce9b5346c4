"""Start a throwaway Orchard Env service in a subprocess (for bench, demo and tests)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def terminate(proc: Optional[subprocess.Popen], timeout: float = 30.0) -> None:
    """SIGTERM a child and wait for it; SIGKILL if it does not go within timeout."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class ServiceProcess:
    """`orchard env serve` on a free port with its own state dir; a context manager."""

    def __init__(self, state_dir: Optional[Path] = None, port: Optional[int] = None,
                 env: Optional[dict[str, str]] = None, args: Optional[list[str]] = None):
        self._tmp = None if state_dir else tempfile.TemporaryDirectory(prefix="orchard-state-")
        self.state_dir = Path(state_dir or self._tmp.name)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, **(env or {})}
        self.args = args if args is not None else ["--no-auth"]
        self.proc: Optional[subprocess.Popen] = None
        self.log_path = self.state_dir / "service.log"

    def start(self, timeout: float = 30.0) -> "ServiceProcess":
        """Launch and wait for /health."""
        cmd = [sys.executable, "-m", "orchard.cli", "env", "serve", "--port", str(self.port),
               "--state-dir", str(self.state_dir), "--log-level", "warning", *self.args]
        self.state_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self._wait_healthy(timeout)
        return self

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"service exited early: {self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"service not healthy after {timeout}s: {self.log_path.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        """SIGTERM and wait."""
        terminate(self.proc)

    def peak_rss(self) -> int:
        """Peak resident memory of the service process, bytes."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return 0

    def __enter__(self) -> "ServiceProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
