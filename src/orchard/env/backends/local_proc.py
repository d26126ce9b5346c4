"""Run the helper for one exec or PTY session: status pipe, capped output, timeout and tree kill."""

from __future__ import annotations

import asyncio
import fcntl
import os
import struct
import termios
import time
from typing import Awaitable, Callable, Optional

from orchard.env.backends.base import ExecOutcome, ExecSpec

KillTree = Callable[[], Awaitable[None]]
DRAIN_GRACE = 0.05      # output still buffered when the command exits; background children may keep pipes open


async def read_status(fd: int, timeout: Optional[float]) -> bytes:
    """Everything written to fd until EOF (or until timeout)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()
    chunks: list[bytes] = []

    def readable() -> None:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            chunks.append(data)
        elif not done.done():
            done.set_result(None)

    os.set_blocking(fd, False)
    loop.add_reader(fd, readable)
    try:
        await asyncio.wait_for(done, timeout)
    except asyncio.TimeoutError:
        pass
    finally:
        loop.remove_reader(fd)
    return b"".join(chunks)


def parse_status(raw: bytes) -> dict[str, str]:
    """{'pid': ..., 'spid': ..., 'err': ...} from the helper's status lines."""
    found: dict[str, str] = {}
    for line in raw.decode("utf-8", "replace").splitlines():
        key, _, value = line.partition(" ")
        found.setdefault(key, value)
    return found


class Capped:
    """Collects a stream up to a byte limit and says whether it cut."""

    def __init__(self, limit: int):
        self.limit, self.parts, self.size, self.truncated = limit, [], 0, False

    async def drain(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            room = self.limit - self.size
            if len(chunk) > room:
                self.truncated = True
                chunk = chunk[:max(room, 0)]
            if chunk:
                self.parts.append(chunk)
                self.size += len(chunk)

    def value(self) -> bytes:
        return b"".join(self.parts)


def _with_status_fd(argv: list[str], fd: int) -> list[str]:
    return argv[:4] + ["--status-fd", str(fd)] + argv[4:]


async def run_helper(argv: list[str], env: dict[str, str], spec: ExecSpec, kill_tree: KillTree) -> ExecOutcome:
    """Run one command through `orchard-sandbox enter` and report how it ended."""
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    started = time.time()
    try:
        proc = await asyncio.create_subprocess_exec(
            *_with_status_fd(argv, status_w), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, pass_fds=(status_w,), env=env)
    finally:
        os.close(status_w)
    out, err = Capped(spec.output_limit), Capped(spec.output_limit)
    readers = {asyncio.create_task(out.drain(proc.stdout)), asyncio.create_task(err.drain(proc.stderr))}
    status_task = asyncio.create_task(read_status(status_r, None))
    timed_out = await _wait_or_kill(proc, spec.timeout, kill_tree)
    await _finish_readers(readers)
    status = parse_status(await _status(status_task, status_r))
    return _outcome(proc.returncode, status, out, err, timed_out, spec.timeout, started)


async def _wait_or_kill(proc: asyncio.subprocess.Process, timeout: float, kill_tree: KillTree) -> bool:
    try:
        await asyncio.wait_for(proc.wait(), timeout)
        return False
    except asyncio.TimeoutError:
        await kill_tree()
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        return True


async def _finish_readers(readers: set[asyncio.Task]) -> None:
    _, pending = await asyncio.wait(readers, timeout=DRAIN_GRACE)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)


async def _status(task: asyncio.Task, fd: int) -> bytes:
    try:
        return await asyncio.wait_for(task, 1.0)
    except asyncio.TimeoutError:
        return b""
    finally:
        os.close(fd)


def _outcome(code: Optional[int], status: dict[str, str], out: Capped, err: Capped, timed_out: bool,
             timeout: float, started: float) -> ExecOutcome:
    stderr, error = err.value(), None
    if code is not None and code < 0:
        code = 128 - code
    problem = status.get("err", "")
    if timed_out:
        code, error = 124, f"Execution timed out after {timeout:g}s"
    elif problem.startswith("cwd "):
        error = f"Working directory does not exist or is not usable: {problem[4:]}"
    elif problem.startswith("exec "):
        stderr += f"{problem[5:]}\n".encode()
    elif problem:
        error = f"Could not run the command in the sandbox: {problem}"
    return ExecOutcome(exit_code=code, stdout=out.value(), stderr=stderr, stdout_truncated=out.truncated,
                       stderr_truncated=err.truncated, error=error, started_at=started)


class PtyHandle:
    """A command on a pseudo-terminal inside a sandbox (see base.PtyProcess)."""

    def __init__(self, proc: asyncio.subprocess.Process, master_fd: int, pid: int, host_pid: int, kill: KillTree):
        self.proc, self.master_fd, self.pid, self.host_pid, self._kill = proc, master_fd, pid, host_pid, kill

    @classmethod
    async def start(cls, argv: list[str], env: dict[str, str], rows: int, cols: int, kill: KillTree) -> "PtyHandle":
        master, slave = os.openpty()
        _set_size(master, rows, cols)
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        try:
            proc = await asyncio.create_subprocess_exec(
                *_with_status_fd(argv, status_w), stdin=slave, stdout=slave, stderr=slave,
                pass_fds=(status_w,), env=env)
        finally:
            os.close(slave)
            os.close(status_w)
        status = parse_status(await read_status(status_r, 10.0))
        os.close(status_r)
        os.set_blocking(master, False)
        return cls(proc, master, int(status.get("spid") or 0), int(status.get("pid") or 0), kill)

    def resize(self, rows: int, cols: int) -> None:
        _set_size(self.master_fd, rows, cols)

    def signal(self, sig: int) -> None:
        if self.host_pid:
            try:
                os.killpg(self.host_pid, sig)
            except ProcessLookupError:
                pass

    async def wait(self) -> int:
        return await self.proc.wait()

    async def kill(self) -> None:
        await self._kill()
        if self.proc.returncode is None:
            self.proc.kill()
        await self.proc.wait()
        try:
            os.close(self.master_fd)
        except OSError:
            pass


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
