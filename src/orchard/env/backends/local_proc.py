"""Run the helper for one exec or PTY session: status pipe, capped output, timeout and tree kill."""

from __future__ import annotations

import asyncio
import fcntl
import os
import struct
import subprocess
import termios
import time
from typing import Awaitable, Callable, Optional

from orchard.env.backends.base import ExecOutcome, ExecSpec

KillTree = Callable[[], Awaitable[None]]
DRAIN_GRACE = 0.05      # output still buffered when the command exits; background children may keep pipes open


class Child:
    """A process started with subprocess.Popen (vfork: cheap even from a large service) awaited through a pidfd."""

    def __init__(self, argv: list[str], env: dict[str, str], stdin: int, stdout: int, stderr: int,
                 pass_fds: tuple[int, ...], new_session: bool = False):
        self.popen = subprocess.Popen(argv, env=env, stdin=stdin, stdout=stdout, stderr=stderr, pass_fds=pass_fds,
                                      close_fds=True, start_new_session=new_session)
        self.pid = self.popen.pid
        self._pidfd = os.pidfd_open(self.pid)

    @classmethod
    async def start(cls, argv: list[str], env: dict[str, str], stdin: int, stdout: int, stderr: int,
                    pass_fds: tuple[int, ...], new_session: bool = False) -> "Child":
        """Spawn from a worker thread: fork/exec releases the GIL, so the event loop keeps serving meanwhile."""
        return await asyncio.to_thread(cls, argv, env, stdin, stdout, stderr, pass_fds, new_session)

    @property
    def returncode(self) -> Optional[int]:
        return self.popen.returncode

    async def wait(self) -> int:
        """Exit status (negative: killed by that signal), without blocking the loop."""
        if self.popen.returncode is None and self._pidfd >= 0:
            await readable(self._pidfd)
        code = self.popen.wait()
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1
        return code

    def kill(self) -> None:
        if self.popen.returncode is None:
            try:
                self.popen.kill()
            except ProcessLookupError:
                pass


async def readable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future = loop.create_future()
    loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        loop.remove_reader(fd)


async def read_fd(fd: int, sink: Callable[[bytes], None], timeout: Optional[float] = None) -> None:
    """Feed everything read from fd to sink until EOF (or timeout); the caller closes fd."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    def on_readable() -> None:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            sink(data)
        elif not done.done():
            done.set_result(None)

    os.set_blocking(fd, False)
    loop.add_reader(fd, on_readable)
    try:
        await asyncio.wait_for(done, timeout)
    except asyncio.TimeoutError:
        pass
    finally:
        loop.remove_reader(fd)


async def read_status(fd: int, timeout: Optional[float]) -> bytes:
    """Everything written to fd until EOF (or until timeout)."""
    chunks: list[bytes] = []
    await read_fd(fd, chunks.append, timeout)
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

    def feed(self, chunk: bytes) -> None:
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
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    started = time.time()
    try:
        proc = await Child.start(_with_status_fd(argv, status_w), env, subprocess.DEVNULL, out_w, err_w, (status_w,))
    except BaseException:
        for fd in (status_r, out_r, err_r):
            os.close(fd)
        raise
    finally:
        for fd in (status_w, out_w, err_w):
            os.close(fd)
    out, err = Capped(spec.output_limit), Capped(spec.output_limit)
    readers = {asyncio.create_task(read_fd(out_r, out.feed)), asyncio.create_task(read_fd(err_r, err.feed))}
    status_task = asyncio.create_task(read_status(status_r, None))
    try:
        timed_out = await _wait_or_kill(proc, spec.timeout, kill_tree)
        await _finish_readers(readers)
    finally:
        os.close(out_r)
        os.close(err_r)
    status = parse_status(await _status(status_task, status_r))
    return _outcome(proc.returncode, status, out, err, timed_out, spec.timeout, started)


async def _wait_or_kill(proc: Child, timeout: float, kill_tree: KillTree) -> bool:
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


async def run_file_op(argv: list[str], env: dict[str, str], data: Optional[bytes], limit: int,
                      pass_fd: int, timeout: float = 600.0) -> tuple[int, bytes, str, dict[str, str]]:
    """Run the helper's put/get inside a sandbox: (exit code, stdout, stderr, status lines)."""
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    in_r, in_w = os.pipe2(os.O_CLOEXEC)
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    try:
        proc = await Child.start(_with_status_fd(argv, status_w), env, in_r, out_w, err_w, (status_w, pass_fd))
    finally:
        for fd in (status_w, in_r, out_w, err_w):
            os.close(fd)
    out, err = Capped(limit + 1), Capped(64 * 1024)
    feeding = asyncio.create_task(asyncio.to_thread(_write_all, in_w, data or b""))
    readers = {asyncio.create_task(read_fd(out_r, out.feed)), asyncio.create_task(read_fd(err_r, err.feed))}
    status_task = asyncio.create_task(read_status(status_r, None))
    try:
        await _wait_or_kill(proc, timeout, _no_tree)
        await _finish_readers(readers)
        await asyncio.gather(feeding, return_exceptions=True)
    finally:
        os.close(out_r)
        os.close(err_r)
    status = parse_status(await _status(status_task, status_r))
    return proc.returncode, out.value(), err.value().decode("utf-8", "replace").strip(), status


async def _no_tree() -> None:
    return None


def _write_all(fd: int, data: bytes) -> None:
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view[:1 << 20]):]
    except OSError:
        pass                    # the helper stopped reading (it failed): its exit code says why
    finally:
        os.close(fd)


class PidWatch:
    """Calls `on_exit(key)` once when a watched process exits (a pidfd turns readable on the event loop)."""

    def __init__(self, on_exit: Callable[[str], None]):
        self._fds: dict[str, int] = {}
        self._on_exit = on_exit

    def __contains__(self, key: str) -> bool:
        return key in self._fds

    def watch(self, key: str, pid: int) -> bool:
        """Start watching; False when the process is already gone."""
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return False
        self._fds[key] = fd
        asyncio.get_running_loop().add_reader(fd, self._fired, key)
        return True

    def unwatch(self, key: str) -> None:
        fd = self._fds.pop(key, None)
        if fd is not None:
            try:
                asyncio.get_running_loop().remove_reader(fd)
            except RuntimeError:
                pass
            os.close(fd)

    def close(self) -> None:
        for key in list(self._fds):
            self.unwatch(key)

    def _fired(self, key: str) -> None:
        self.unwatch(key)
        self._on_exit(key)


class PtyHandle:
    """A command on a pseudo-terminal inside a sandbox (see base.PtyProcess)."""

    def __init__(self, proc: Child, master_fd: int, pid: int, host_pid: int, kill: KillTree):
        self.proc, self.master_fd, self.pid, self.host_pid, self._kill = proc, master_fd, pid, host_pid, kill

    @classmethod
    async def start(cls, argv: list[str], env: dict[str, str], rows: int, cols: int, kill: KillTree) -> "PtyHandle":
        master, slave = os.openpty()
        _set_size(master, rows, cols)
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        try:
            proc = await Child.start(_with_status_fd(argv, status_w), env, slave, slave, slave, (status_w,))
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
