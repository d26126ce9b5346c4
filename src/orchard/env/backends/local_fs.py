"""File operations on a sandbox resolved inside the sandbox's own root, never on the host.

Every path is walked by the kernel with ``openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)``
relative to a directory fd of the sandbox root (``/proc/<pid>/root`` of its init), so an
absolute or relative symlink, or ``..``, planted inside the sandbox resolves against the
sandbox's root and cannot name a host file. Writes never follow the final component: the
new content goes to a temporary file in the (safely resolved) parent directory that is then
renamed over the name, replacing a symlink rather than writing through it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import posixpath
import secrets
import stat
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Iterator, Optional

from orchard.errors import BackendError, NotFoundError, OrchardError, PayloadTooLargeError, RequestError
from orchard.env.protocol import FileEntry

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
_RESOLVE = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS
_SYS_OPENAT2 = 437 + (110 if platform.machine() == "alpha" else 0)
_CHUNK = 1 << 20
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def openat2(dirfd: int, path: str, flags: int, mode: int = 0, resolve: int = _RESOLVE) -> int:
    """The openat2 system call; retries the EAGAIN the kernel returns on a racing rename."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve)
    raw = os.fsencode(path)
    for _ in range(16):
        fd = _libc.syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dirfd), ctypes.c_char_p(raw),
                           ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err not in (errno.EAGAIN, errno.EINTR):
            raise OSError(err, os.strerror(err), path)
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), path)


def normalize(path: str) -> str:
    """Lexically normalise an in-sandbox path to a root-relative one ('.' for the root)."""
    if "\x00" in path:
        raise RequestError("path must not contain NUL bytes")
    clean = posixpath.normpath("/" + path).lstrip("/")
    return clean or "."


def _error(e: OSError, path: str) -> OrchardError:
    """Map an OS error on an in-sandbox path to the Orchard error the caller should see."""
    code, why = e.errno, os.strerror(e.errno or 0)
    if code == errno.ENOENT:
        return NotFoundError(f"No such file or directory: {path}")
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return PayloadTooLargeError(f"Cannot write {path}: {why}")
    if code == errno.ELOOP:
        return RequestError(f"Cannot resolve {path}: too many symlinks or a link out of the sandbox")
    if code in (errno.ENOTDIR, errno.EISDIR, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENAMETOOLONG,
                errno.EINVAL, errno.EXDEV, errno.ENXIO, errno.ETXTBSY, errno.EBUSY):
        return RequestError(f"Cannot access {path}: {why}")
    return BackendError(f"File operation on {path} failed: {why}")


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "directory"
    return "symlink" if stat.S_ISLNK(mode) else "file"


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat()


def _printable(name: str) -> str:
    """A name that survives JSON: undecodable bytes become U+FFFD."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _read_upto(fd: int, n: int) -> bytes:
    parts, left = [], n
    while left > 0:
        chunk = os.read(fd, min(left, _CHUNK))
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view[:_CHUNK]):]


class SandboxFS:
    """Blocking file operations inside one sandbox's root (run them in a thread)."""

    def __init__(self, root: str):
        self.root = root

    # ------------------------------------------------------------ public
    def read(self, path: str, limit: int) -> bytes:
        """The whole content of a regular file; 404 missing, 400 directory, 413 over ``limit``."""
        with self._opened(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY) as fd:
            st = os.fstat(fd)
            self._check_readable(path, st, limit)
            data = _read_upto(fd, limit + 1)
        if len(data) > limit:
            raise PayloadTooLargeError(f"{path} is larger than the {limit}-byte limit")
        return data

    def write(self, path: str, data: bytes, mode: Optional[int] = None) -> None:
        """Replace ``path`` with ``data``, creating parents (0755); new files get ``mode`` or 0644."""
        rel = normalize(path)
        if rel == ".":
            raise RequestError(f"{path} is a directory")
        parent, name = posixpath.split(rel)
        with self._root() as root:
            dfd = self._ensure_dir(root, parent, path)
            try:
                self._replace(dfd, name, data, mode, path)
            except OSError as e:
                raise _error(e, path) from e
            finally:
                os.close(dfd)

    def list(self, path: str) -> list[FileEntry]:
        """Entries of a directory sorted by name, symlinks not followed; 404 missing, 400 not a directory."""
        with self._opened(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY) as fd:
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                raise RequestError(f"{path} is not a directory")
            entries = [e for e in map(lambda n: self._entry(fd, n), os.listdir(fd)) if e is not None]
        return sorted(entries, key=lambda e: e.name)

    def stat_kind(self, path: str) -> Optional[str]:
        """What ``path`` resolves to inside the root: 'directory', 'file', or None when missing."""
        try:
            with self._opened(path, os.O_PATH) as fd:
                return "directory" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        except (NotFoundError, RequestError):
            return None

    # ------------------------------------------------------------ resolution
    @contextmanager
    def _root(self) -> Iterator[int]:
        try:
            fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise BackendError(f"Sandbox root {self.root} is not available: {os.strerror(e.errno or 0)}") from e
        try:
            yield fd
        finally:
            os.close(fd)

    @contextmanager
    def _opened(self, path: str, flags: int) -> Iterator[int]:
        """An fd of ``path`` resolved inside the root."""
        rel = normalize(path)
        with self._root() as root:
            try:
                fd = openat2(root, rel, flags)
            except OSError as e:
                raise _error(e, path) from e
            try:
                yield fd
            finally:
                os.close(fd)

    def _ensure_dir(self, root: int, parent: str, path: str) -> int:
        """An O_PATH fd of directory ``parent`` (root-relative), creating missing components 0755."""
        fd = os.dup(root)
        parts = [p for p in parent.split("/") if p]
        try:
            for i, name in enumerate(parts):
                nxt = self._child_dir(root, fd, "/".join(parts[: i + 1]), name)
                os.close(fd)
                fd = nxt
        except OSError as e:
            os.close(fd)
            raise _error(e, path) from e
        return fd

    @staticmethod
    def _child_dir(root: int, parent_fd: int, prefix: str, name: str) -> int:
        """Open ``prefix`` inside the root; if missing, make ``name`` in ``parent_fd`` (0755) first."""
        try:
            return openat2(root, prefix, os.O_PATH | os.O_DIRECTORY)
        except FileNotFoundError:
            pass
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            pass  # a racing creator, or a dangling symlink: the reopen below says which
        fd = openat2(root, prefix, os.O_RDONLY | os.O_DIRECTORY)
        os.fchmod(fd, 0o755)
        return fd

    # ------------------------------------------------------------ helpers
    @staticmethod
    def _check_readable(path: str, st: os.stat_result, limit: int) -> None:
        if stat.S_ISDIR(st.st_mode):
            raise RequestError(f"{path} is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise RequestError(f"{path} is not a regular file")
        if st.st_size > limit:
            raise PayloadTooLargeError(f"{path} is {st.st_size} bytes, over the {limit}-byte limit")

    @staticmethod
    def _replace(dfd: int, name: str, data: bytes, mode: Optional[int], path: str) -> None:
        """Write a temporary file next to ``name`` and rename it over ``name`` (never following it)."""
        old = _lstat(dfd, name)
        if old is not None and stat.S_ISDIR(old.st_mode):
            raise RequestError(f"{path} is a directory")
        keep = old if old is not None and stat.S_ISREG(old.st_mode) else None
        tmp = f".{name[:200]}.orchard-{secrets.token_hex(6)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            _fill(fd, data, mode, keep)
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            _unlink_quietly(dfd, tmp)
            raise
        finally:
            os.close(fd)

    @staticmethod
    def _entry(dfd: int, name: str) -> Optional[FileEntry]:
        st = _lstat(dfd, name)
        if st is None:
            return None  # removed while listing
        return FileEntry(name=_printable(name), type=_kind(st.st_mode), size=st.st_size, modified=_iso(st.st_mtime))


def _lstat(dfd: int, name: str) -> Optional[os.stat_result]:
    try:
        return os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _fill(fd: int, data: bytes, mode: Optional[int], keep: Optional[os.stat_result]) -> None:
    """Write the content, then the owner and mode of the file it replaces (or ``mode``/0644)."""
    _write_all(fd, data)
    if keep is not None:
        os.fchown(fd, keep.st_uid, keep.st_gid)
    default = stat.S_IMODE(keep.st_mode) if keep is not None else 0o644
    os.fchmod(fd, default if mode is None else mode)


def _unlink_quietly(dfd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except OSError:
        pass
