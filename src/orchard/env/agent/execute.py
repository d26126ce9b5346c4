"""Run one command for the agent: its own process group, output caps, a timeout that kills the group."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import threading
import time
from typing import Optional

from . import PRIVATE_ENV

OWN: set = set()                 # pids of commands a request waits for (the PID-1 reaper leaves them)
SPAWN_LOCK = threading.Lock()     # held while a pid enters OWN, so the reaper never takes a fresh child
DRAIN_GRACE = 0.3        # seconds to keep reading after the command exits (a background child may hold the pipes)


class Capped:
    """The first ``limit`` bytes of a stream, and whether more came."""

    def __init__(self, limit: int):
        self.limit, self.parts, self.size, self.truncated = limit, [], 0, False

    def feed(self, data: bytes) -> None:
        room = self.limit - self.size
        if len(data) > room:
            self.truncated = True
            data = data[:max(room, 0)]
        if data:
            self.parts.append(data)
            self.size += len(data)

    def value(self) -> bytes:
        return b"".join(self.parts)


def child_env(extra: dict) -> dict:
    """The agent's own environment (the image's), without the agent's private variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in PRIVATE_ENV}
    env.update({str(k): str(v) for k, v in extra.items()})
    return env


def run(argv: list, cwd: str, env: dict, timeout: float, output_limit: int) -> dict:
    """Run argv (no shell) and return the outcome as a JSON-ready dict (bytes left for the caller to encode)."""
    started = time.time()
    if not os.path.isdir(cwd):
        return _result(1, b"", b"", False, False, f"Working directory does not exist or is not usable: {cwd}",
                       started)
    try:
        proc = spawn(argv, cwd=cwd, env=child_env(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, start_new_session=True)
    except FileNotFoundError:
        return _result(127, b"", f"{argv[0]}: command not found\n".encode(), False, False, None, started)
    except PermissionError as e:
        return _result(126, b"", f"{argv[0]}: {e.strerror}\n".encode(), False, False, None, started)
    out, err = Capped(output_limit), Capped(output_limit)
    try:
        timed_out = _pump(proc, out, err, timeout)
    finally:
        OWN.discard(proc.pid)
    code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    error = None
    if timed_out:
        code, error = 124, f"Execution timed out after {timeout:g}s"
    return _result(code, out.value(), err.value(), out.truncated, err.truncated, error, started)


def spawn(argv: list, **kwargs) -> subprocess.Popen:
    """Popen, with the child's pid recorded in OWN before any reaper can see it."""
    with SPAWN_LOCK:
        proc = subprocess.Popen(argv, **kwargs)
        OWN.add(proc.pid)
    return proc


def _pump(proc: subprocess.Popen, out: Capped, err: Capped, timeout: float) -> bool:
    """Read both pipes until the command ends (then briefly drain); True when the timeout killed it."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    deadline, drain_until, timed_out = time.monotonic() + timeout, None, False
    try:
        while sel.get_map():
            now = time.monotonic()
            if drain_until is None and proc.poll() is not None:
                drain_until = now + DRAIN_GRACE
            if drain_until is None and now >= deadline:
                kill_group(proc.pid)
                proc.wait()
                timed_out, drain_until = True, now + DRAIN_GRACE
            if drain_until is not None and now >= drain_until:
                break
            limit = (drain_until or deadline) - now
            for key, _ in sel.select(min(max(limit, 0.0), 0.1)):
                _read(sel, key)
    finally:
        sel.close()
        proc.stdout.close()
        proc.stderr.close()
    proc.wait()
    return timed_out


def _read(sel: selectors.BaseSelector, key: selectors.SelectorKey) -> None:
    data = os.read(key.fd, 65536)
    if data:
        key.data.feed(data)
    else:
        sel.unregister(key.fileobj)


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by pid (the command and everything it started)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _result(code: Optional[int], stdout: bytes, stderr: bytes, out_trunc: bool, err_trunc: bool,
            error: Optional[str], started: float) -> dict:
    return {"exit_code": code, "stdout": stdout, "stderr": stderr, "stdout_truncated": out_trunc,
            "stderr_truncated": err_trunc, "error": error, "started_at": started}
