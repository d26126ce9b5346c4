"""The engine-API path of the container backend: exec, files and PTY through Docker Engine API calls only.

Used when the engine runs elsewhere (its processes cannot be entered from here). Every function
blocks (the backend runs it in a thread) and takes a ``docker.APIClient`` and a container id.

Tree-kill without host access: every exec carries ``ORCHARD_JOB=<job>`` in its environment,
which its children inherit; killing a job is a second exec that signals every process whose
environment holds that marker. It needs ``sh`` and ``grep`` in the image, and a process that
clears its environment escapes it (the fast path's cgroups have no such gap).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import posixpath
import select
import socket
import stat
import struct
import tarfile
import threading
import time
import uuid
from datetime import datetime, timezone
from typing import Optional

import docker.errors

from orchard import errors
from orchard.env.backends.base import ExecOutcome, ExecSpec
from orchard.env.backends.local_proc import Capped
from orchard.env.protocol import FileEntry

JOB_VAR = "ORCHARD_JOB"
DRAIN_GRACE = 0.05
KILL_SCRIPT = ('for i in 1 2 3; do for d in /proc/[0-9]*; do '
               'grep -qsF "$1" "$d/environ" && kill -"$2" "${d#/proc/}"; done 2>/dev/null; done; exit 0')
LIST_SCRIPT = ('cd -- "$1" 2>/dev/null || { if [ -e "$1" ]; then exit 3; fi; exit 2; }; '
               'for f in .[!.]* ..?* *; do if [ -e "$f" ] || [ -L "$f" ]; then '
               'stat -c "%f %s %Y %n" -- "$f" || exit 5; fi; done')
GO_DIR, GO_SYMLINK = 1 << 31, 1 << 27
GO_SPECIAL = (1 << 26) | (1 << 25) | (1 << 24) | (1 << 21)   # device, pipe, socket, char device


# ---------------------------------------------------------------- exec
class Hijacked:
    """The raw connection of an attached exec: multiplexed frames (or raw bytes on a TTY) in, stdin out."""

    def __init__(self, api, exec_id: str, tty: bool = False):
        self.response = api._post_json(api._url("/exec/{0}/start", exec_id), data={"Tty": tty, "Detach": False},
                                       headers={"Connection": "Upgrade", "Upgrade": "tcp"}, stream=True)
        api._raise_for_status(self.response)
        buffered = self.response.raw._fp.fp                  # http.client's reader: it may hold bytes already
        self.sock: socket.socket = buffered.raw._sock
        self.sock.setblocking(False)
        self.pending = buffered.peek()          # non-blocking: only what is already buffered
        if self.pending:
            buffered.read(len(self.pending))

    def fileno(self) -> int:
        return self.sock.fileno()

    def recv(self, timeout: float) -> Optional[bytes]:
        """Bytes that arrived (b'' at end of stream), or None when none came within timeout."""
        if self.pending:
            data, self.pending = self.pending, b""
            return data
        ready, _, _ = select.select([self.sock], [], [], max(timeout, 0))
        if not ready:
            return None
        try:
            return self.sock.recv(65536)
        except BlockingIOError:
            return None
        except OSError:
            return b""

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            self.response.close()


class Frames:
    """Splits the multiplexed stream (8-byte header: stream, 0, 0, 0, big-endian length) into the two outputs."""

    def __init__(self, out: Capped, err: Capped):
        self.buffer, self.sinks = b"", {1: out, 2: err}

    def feed(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= 8:
            kind, size = self.buffer[0], struct.unpack(">I", self.buffer[4:8])[0]
            if len(self.buffer) < 8 + size:
                return
            chunk, self.buffer = self.buffer[8:8 + size], self.buffer[8 + size:]
            self.sinks.get(kind, self.sinks[2]).feed(chunk)


def run(api, container_id: str, spec: ExecSpec, cwd: str, env: dict[str, str]) -> ExecOutcome:
    """Run one command with the engine's exec; on timeout kill its tree and report 124."""
    job = uuid.uuid4().hex[:16]
    started = time.time()
    exec_id = api.exec_create(container_id, spec.argv, stdout=True, stderr=True, workdir=cwd,
                              environment={**env, JOB_VAR: job})["Id"]
    out, err = Capped(spec.output_limit), Capped(spec.output_limit)
    stream = Hijacked(api, exec_id)
    try:
        timed_out = _pump(api, container_id, exec_id, stream, Frames(out, err), spec.timeout, job)
    finally:
        stream.close()
    code = _exit_code(api, exec_id)
    return _outcome(code, out, err, timed_out, spec, cwd, started)


def _pump(api, container_id: str, exec_id: str, stream: Hijacked, frames: Frames, timeout: float, job: str) -> bool:
    """Read until the stream ends, the process ends (a background child may hold the stream), or the deadline."""
    deadline = time.monotonic() + timeout
    next_check, interval = time.monotonic() + 0.2, 0.2
    while True:
        now = time.monotonic()
        if now >= deadline:
            kill(api, container_id, job)
            _drain(stream, frames, 2.0)
            return True
        data = stream.recv(min(deadline, next_check) - now)
        if data == b"":
            return False
        if data:
            frames.feed(data)
        elif time.monotonic() >= next_check:
            if not _running(api, exec_id):
                _drain(stream, frames, DRAIN_GRACE)
                return False
            interval = min(interval * 2, 2.0)
            next_check = time.monotonic() + interval


def _drain(stream: Hijacked, frames: Frames, grace: float) -> None:
    end = time.monotonic() + grace
    while (left := end - time.monotonic()) > 0:
        data = stream.recv(left)
        if not data:
            return
        frames.feed(data)


def _running(api, exec_id: str) -> bool:
    try:
        return bool(api.exec_inspect(exec_id).get("Running"))
    except docker.errors.APIError:
        return False


def _exit_code(api, exec_id: str) -> Optional[int]:
    deadline = time.monotonic() + 2.0
    while True:
        try:
            info = api.exec_inspect(exec_id)
        except docker.errors.APIError:
            return None
        if not info.get("Running") or time.monotonic() > deadline:
            return info.get("ExitCode")
        time.sleep(0.01)


def kill(api, container_id: str, job: str, sig: int = 9) -> None:
    """Signal every process of the job (those whose environment holds its marker)."""
    try:
        exec_id = api.exec_create(container_id, ["sh", "-c", KILL_SCRIPT, "sh", f"{JOB_VAR}={job}", str(sig)],
                                  stdout=True, stderr=True, user="0")["Id"]
        api.exec_start(exec_id)
    except docker.errors.APIError:
        pass          # the container is gone: so is the job


def _outcome(code: Optional[int], out: Capped, err: Capped, timed_out: bool, spec: ExecSpec, cwd: str,
             started: float) -> ExecOutcome:
    stderr, error = err.value(), None
    if timed_out:
        code, error = 124, f"Execution timed out after {spec.timeout:g}s"
    elif code in (126, 127) and b"chdir to cwd" in stderr:
        stderr, error = b"", f"Working directory does not exist or is not usable: {cwd}"
    elif code in (126, 127) and b"OCI runtime" in stderr:
        stderr = f"{spec.argv[0]}: command not found or not executable\n".encode()
    return ExecOutcome(exit_code=code, stdout=out.value(), stderr=stderr, stdout_truncated=out.truncated,
                       stderr_truncated=err.truncated, error=error, started_at=started)


# ---------------------------------------------------------------- PTY
class ApiPty:
    """A command on the engine's TTY exec (see base.PtyProcess).

    master_fd is one end of a socket pair; a thread relays it to the attached connection, so
    bytes that arrived with the engine's reply are not lost and the server reads one fd."""

    def __init__(self, api, container_id: str, argv: list[str], cwd: str, env: dict[str, str], rows: int, cols: int):
        self.api, self.container_id, self.job = api, container_id, uuid.uuid4().hex[:16]
        self.exec_id = api.exec_create(container_id, argv, stdin=True, tty=True, workdir=cwd,
                                       environment={**env, JOB_VAR: self.job})["Id"]
        self.stream = Hijacked(api, self.exec_id, tty=True)
        self._near, far = socket.socketpair()
        self._near.setblocking(False)            # like a PTY master: the server reads it when readable
        self.master_fd, self.pid, self._signalled = self._near.fileno(), 0, 0
        self._ended = threading.Event()          # the engine closed the stream: the command is over
        threading.Thread(target=self._relay, args=(far,), daemon=True, name="orchard-pty-relay").start()
        self.resize(rows, cols)

    def _relay(self, far: socket.socket) -> None:
        conn = self.stream.sock
        try:
            if self.stream.pending:
                far.sendall(self.stream.pending)
            while True:
                ready, _, _ = select.select([conn, far], [], [])
                if conn in ready and not _forward(conn, far):
                    return
                if far in ready and not _forward(far, conn):
                    return
        except OSError:
            return
        finally:
            far.close()
            self._ended.set()

    def resize(self, rows: int, cols: int) -> None:
        try:
            self.api.exec_resize(self.exec_id, height=rows, width=cols)
        except docker.errors.APIError:
            pass

    def signal(self, sig: int) -> None:
        self._signalled = sig
        kill(self.api, self.container_id, self.job, sig)

    async def wait(self) -> int:
        """Podman reports an exec that has not begun yet as not running with code 0: until the exec has been
        seen running, only the end of its stream says it is over."""
        seen = False
        while True:
            running = await asyncio.to_thread(_running, self.api, self.exec_id)
            seen = seen or running
            if not running and (seen or self._ended.is_set()):
                break
            await asyncio.sleep(0.05)
        code = await asyncio.to_thread(_exit_code, self.api, self.exec_id)
        if code is not None and self._signalled and code == 128 + self._signalled:
            return -self._signalled
        return code if code is not None else -9

    async def kill(self) -> None:
        await asyncio.to_thread(kill, self.api, self.container_id, self.job)
        self.stream.close()
        self._near.close()


def _forward(src: socket.socket, dst: socket.socket) -> bool:
    try:
        data = src.recv(65536)
    except BlockingIOError:
        return True
    if not data:
        return False
    dst.setblocking(True)
    dst.sendall(data)
    return True


# ---------------------------------------------------------------- files
def path_stat(api, container_id: str, path: str) -> Optional[dict]:
    """The engine's stat of a path in the container (name, size, mode as a Go FileMode, linkTarget); None if absent."""
    response = api.head(api._url("/containers/{0}/archive", container_id), params={"path": path})
    if response.status_code == 404:
        return None
    if response.status_code >= 400:
        raise errors.BackendError(f"Could not stat {path} in the sandbox (engine answered {response.status_code})")
    header = response.headers.get("X-Docker-Container-Path-Stat", "")
    return json.loads(base64.b64decode(header)) if header else None


def _resolved(api, container_id: str, path: str) -> tuple[str, Optional[dict]]:
    """Follow symlinks as the engine resolves them (inside the container), at most 16 hops."""
    for _ in range(16):
        st = path_stat(api, container_id, path)
        if st is None or not st["mode"] & GO_SYMLINK:
            return path, st
        path = st.get("linkTarget") or path
    raise errors.RequestError(f"Cannot resolve {path}: too many symlinks")


def read_file(api, container_id: str, path: str, limit: int) -> bytes:
    path, st = _resolved(api, container_id, path)
    if st is None:
        raise errors.NotFoundError(f"File not found: {path}")
    if st["mode"] & GO_DIR:
        raise errors.RequestError(f"{path} is a directory", status_code=400)
    if st["mode"] & GO_SPECIAL:
        raise errors.RequestError(f"{path} is not a regular file", status_code=400)
    if st["size"] > limit:
        raise errors.PayloadTooLargeError(f"{path} is {st['size']} bytes (limit {limit} bytes)")
    stream, _ = api.get_archive(container_id, path)
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream)), mode="r|") as tar:
        for member in tar:
            if member.isfile():
                data = tar.extractfile(member).read(limit + 1)
                if len(data) > limit:
                    raise errors.PayloadTooLargeError(f"{path} grew past {limit} bytes")
                return data
    raise errors.RequestError(f"{path} is not a regular file", status_code=400)


def write_file(api, container_id: str, path: str, data: bytes, mode: Optional[int]) -> None:
    path, st = _resolved(api, container_id, path)
    if st is not None and st["mode"] & (GO_DIR | GO_SPECIAL):
        raise errors.RequestError(f"{path} is not a regular file", status_code=400)
    if mode is None:
        mode = st["mode"] & 0o7777 if st is not None else 0o644
    base, missing = _existing_parent(api, container_id, posixpath.dirname(path))
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for i in range(len(missing)):
            info = tarfile.TarInfo(posixpath.join(*missing[: i + 1]))
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, time.time()
            tar.addfile(info)
        info = tarfile.TarInfo(posixpath.join(*missing, posixpath.basename(path)))
        info.size, info.mode, info.mtime = len(data), mode & 0o7777, time.time()
        tar.addfile(info, io.BytesIO(data))
    try:
        api.put_archive(container_id, base, archive.getvalue())
    except docker.errors.APIError as e:
        raise _write_error(e, path, len(data)) from e


def set_root_mode(api, container_id: str, mode: int) -> None:
    """Change the mode of the container's / (an archive holding only '.')."""
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        info = tarfile.TarInfo(".")
        info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, time.time()
        tar.addfile(info)
    api.put_archive(container_id, "/", archive.getvalue())


def _existing_parent(api, container_id: str, directory: str) -> tuple[str, list[str]]:
    """(deepest existing ancestor, the names to create below it); a file in the way is a 400."""
    missing: list[str] = []
    while True:
        directory, st = _resolved(api, container_id, directory)
        if st is not None:
            if not st["mode"] & GO_DIR:
                raise errors.RequestError(f"{directory} is not a directory", status_code=400)
            return directory, list(reversed(missing))
        directory, name = posixpath.split(directory.rstrip("/"))
        missing.append(name)


def _write_error(e: docker.errors.APIError, path: str, size: int) -> errors.OrchardError:
    message = str(e.explanation or e)
    if "no space" in message.lower() or "quota" in message.lower():
        return errors.PayloadTooLargeError(f"Cannot write {path}: no space left in the sandbox ({size} bytes)")
    return errors.RequestError(f"Cannot write {path}: {message}", status_code=400)


def list_dir(api, container_id: str, path: str) -> list[FileEntry]:
    """A POSIX shell loop with `stat` inside the container (never a tar of the whole tree)."""
    exec_id = api.exec_create(container_id, ["sh", "-c", LIST_SCRIPT, "sh", path], stdout=True, stderr=True)["Id"]
    out, err = api.exec_start(exec_id, demux=True)
    code = api.exec_inspect(exec_id).get("ExitCode")
    if code == 2:
        raise errors.NotFoundError(f"No such file or directory: {path}")
    if code == 3:
        raise errors.RequestError(f"{path} is not a directory", status_code=400)
    if code != 0:
        why = (err or b"").decode("utf-8", "replace").strip()[-300:]
        raise errors.BackendError(f"Listing {path} failed (exit {code}): {why or 'the image needs sh and stat'}")
    return sorted(filter(None, map(_entry, (out or b"").decode("utf-8", "replace").splitlines())),
                  key=lambda e: e.name)


def _entry(line: str) -> Optional[FileEntry]:
    try:
        mode, size, mtime, name = line.split(" ", 3)
        kind = int(mode, 16)
        modified = datetime.fromtimestamp(int(mtime), timezone.utc).isoformat()
    except ValueError:
        return None
    if stat.S_ISLNK(kind):
        return FileEntry(name=name, type="symlink", size=int(size), modified=modified)
    return FileEntry(name=name, type="directory" if stat.S_ISDIR(kind) else "file", size=int(size), modified=modified)
