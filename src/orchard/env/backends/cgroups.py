"""Cgroups of local sandboxes (v1 and v2): limits, per-job groups, freeze and tree-kill.

Layout. v1: in each of the memory, pids, cpu and freezer hierarchies a sandbox lives at
``<mount>/<this process's path there>/<parent_name>/<sandbox_id>``; per-job groups exist only
in the freezer hierarchy, as children of the sandbox's group. v2: ``<root>/<parent_name>/<id>``
(or, when the root cannot be written, the same under this process's own delegated cgroup),
with per-job children and no controllers enabled below the sandbox, so a process may live in
the sandbox group or in a job group. Every operation is a plain file write or mkdir/rmdir.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import time
from typing import Iterable, Optional

from orchard.errors import BackendError

LIMIT_CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD = 100_000
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
_GONE = (errno.ENOENT, errno.ENODEV, errno.ESRCH)


def _check_name(name: str) -> str:
    if not _NAME.match(name):
        raise BackendError(f"invalid cgroup name {name!r}")
    return name


def _write(path: str, value: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError as e:
        raise BackendError(f"cannot write {value!r} to {path}: {os.strerror(e.errno or 0)}") from e


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _mkdir(path: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise BackendError(f"cannot create cgroup {path}: {os.strerror(e.errno or 0)}") from e


def _subdirs(path: str) -> list[str]:
    try:
        return [e.path for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _procs(path: str) -> list[int]:
    """Pids of one cgroup and all its descendants."""
    own = [int(p) for p in (_read(os.path.join(path, "cgroup.procs")) or "").split()]
    return own + [pid for sub in _subdirs(path) for pid in _procs(sub)]


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _relative(path: str, mount_root: str) -> str:
    """A /proc/self/cgroup path made relative to what a mount shows."""
    if mount_root != "/" and (path == mount_root or path.startswith(mount_root + "/")):
        path = path[len(mount_root):]
    return path.lstrip("/")


class Cgroups:
    """Create, limit, freeze, kill and remove the cgroups of sandboxes and of their jobs."""

    def __init__(self, root: str = "/sys/fs/cgroup", parent_name: str = "orchard", *,
                 proc_self: str = "/proc/self", kill_timeout: float = 10.0):
        self.root = root
        self.parent_name = _check_name(parent_name)
        self.proc_self = proc_self
        self.kill_timeout = kill_timeout
        self.version = 2 if os.path.exists(os.path.join(root, "cgroup.controllers")) else 1
        self.controllers: set[str] = set()
        self.available, self.why = True, ""
        self._limit_bases: dict[str, str] = {}    # controller -> <...>/<parent_name>
        self._kill_base = ""                       # freezer (v1) or unified (v2) <...>/<parent_name>
        try:
            self._setup_v2() if self.version == 2 else self._setup_v1()
        except BackendError as e:
            self.available, self.why = False, e.detail

    # ------------------------------------------------------------ setup
    def _own_paths(self) -> dict[str, str]:
        """This process's cgroup path per controller ('' for the v2 hierarchy)."""
        text = _read(os.path.join(self.proc_self, "cgroup")) or ""
        paths: dict[str, str] = {}
        for line in text.splitlines():
            _, names, path = line.split(":", 2)
            for name in names.split(",") if names else [""]:
                paths[name] = path
        return paths

    def _v1_mounts(self) -> dict[str, tuple[str, str]]:
        """controller -> (mount point, cgroup path that mount shows), mounts under root first."""
        found: dict[str, tuple[str, str]] = {}
        for line in (_read(os.path.join(self.proc_self, "mountinfo")) or "").splitlines():
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(tail) < 3 or tail[0] != "cgroup":
                continue
            point = _unescape(fields[4])
            for opt in set(tail[2].split(",")) & {*LIMIT_CONTROLLERS, "freezer"}:
                if opt not in found or (self._under_root(point) and not self._under_root(found[opt][0])):
                    found[opt] = (point, _unescape(fields[3]))
        return found

    def _under_root(self, path: str) -> bool:
        return path.startswith(self.root.rstrip("/") + "/")

    def _setup_v1(self) -> None:
        mounts, own = self._v1_mounts(), self._own_paths()
        if "freezer" not in mounts:
            raise BackendError("cgroup v1 without a freezer hierarchy: cannot kill process trees")
        for name, (point, mount_root) in mounts.items():
            base = os.path.join(point, _relative(own.get(name, "/"), mount_root), self.parent_name)
            _mkdir(base)
            if name == "freezer":
                self._kill_base = base
            else:
                self._limit_bases[name] = base
        self.controllers = set(self._limit_bases)

    def _setup_v2(self) -> None:
        wanted = self._v2_wanted(self.root)
        try:
            self._enable(self.root, wanted)
            parent = os.path.join(self.root, self.parent_name)
            _mkdir(parent)
        except BackendError:
            parent = self._delegate()
            wanted = self._v2_wanted(os.path.dirname(parent))
        self._enable(parent, wanted)
        self._kill_base = parent
        self._limit_bases = {c: parent for c in wanted}
        self.controllers = set(wanted)

    @staticmethod
    def _v2_wanted(path: str) -> list[str]:
        available = (_read(os.path.join(path, "cgroup.controllers")) or "").split()
        return [c for c in LIMIT_CONTROLLERS if c in available]

    @staticmethod
    def _enable(path: str, controllers: list[str]) -> None:
        current = set((_read(os.path.join(path, "cgroup.subtree_control")) or "").split())
        missing = [c for c in controllers if c not in current]
        if missing:
            _write(os.path.join(path, "cgroup.subtree_control"), " ".join("+" + c for c in missing))

    def _delegate(self) -> str:
        """Move this cgroup's processes into a leaf 'service' and nest the parent beside it."""
        own = os.path.join(self.root, self._own_paths().get("", "/").lstrip("/"))
        leaf = os.path.join(own, "service")
        _mkdir(leaf)
        for pid in [int(p) for p in (_read(os.path.join(own, "cgroup.procs")) or "").split()] or [os.getpid()]:
            try:
                _write(os.path.join(leaf, "cgroup.procs"), str(pid))
            except BackendError:
                if pid == os.getpid():
                    raise
        self._enable(own, self._v2_wanted(own))
        parent = os.path.join(own, self.parent_name)
        _mkdir(parent)
        return parent

    # ------------------------------------------------------------ layout
    def _bases(self) -> list[str]:
        """Every distinct <...>/<parent_name> directory, the kill hierarchy last."""
        others = [b for b in dict.fromkeys(self._limit_bases.values()) if b != self._kill_base]
        return others + [self._kill_base]

    def _dirs(self, sandbox_id: str) -> list[str]:
        _check_name(sandbox_id)
        return [os.path.join(b, sandbox_id) for b in self._bases()]

    def _job_dir(self, sandbox_id: str, job: str) -> str:
        return os.path.join(self._kill_base, _check_name(sandbox_id), _check_name(job))

    def _require(self) -> None:
        if not self.available:
            raise BackendError(f"cgroups are not available: {self.why}")

    # ------------------------------------------------------------ sandboxes
    def create(self, sandbox_id: str, cpu: Optional[float] = None, memory: Optional[int] = None,
               pids: Optional[int] = None) -> list[str]:
        """Make the sandbox's groups with its limits; return the cgroup.procs files to join it."""
        self._require()
        dirs = self._dirs(sandbox_id)
        try:
            for d in dirs:
                _mkdir(d)
            self._set_limits(sandbox_id, cpu, memory, pids)
        except BackendError:
            try:
                self.remove(sandbox_id)
            except BackendError:
                pass  # the first error is the one worth reporting
            raise
        return [os.path.join(d, "cgroup.procs") for d in dirs]

    def _set_limits(self, sandbox_id: str, cpu: Optional[float], memory: Optional[int],
                    pids: Optional[int]) -> None:
        if memory is not None:
            self._set_memory(self._limit_dir("memory", sandbox_id), memory)
        if cpu is not None:
            self._set_cpu(self._limit_dir("cpu", sandbox_id), cpu)
        if pids is not None:
            _write(os.path.join(self._limit_dir("pids", sandbox_id), "pids.max"), str(int(pids)))

    def _limit_dir(self, controller: str, sandbox_id: str) -> str:
        if controller not in self._limit_bases:
            raise BackendError(f"a {controller} limit was asked for but the {controller} controller "
                               f"is not available under {self.root}")
        return os.path.join(self._limit_bases[controller], sandbox_id)

    def _set_memory(self, d: str, memory: int) -> None:
        if self.version == 1:
            _write(os.path.join(d, "memory.limit_in_bytes"), str(int(memory)))
            return
        _write(os.path.join(d, "memory.max"), str(int(memory)))
        if os.path.exists(os.path.join(d, "memory.swap.max")):
            _write(os.path.join(d, "memory.swap.max"), "0")

    def _set_cpu(self, d: str, cpu: float) -> None:
        quota = max(1000, int(round(cpu * CPU_PERIOD)))
        if self.version == 2:
            _write(os.path.join(d, "cpu.max"), f"{quota} {CPU_PERIOD}")
            return
        _write(os.path.join(d, "cpu.cfs_period_us"), str(CPU_PERIOD))
        _write(os.path.join(d, "cpu.cfs_quota_us"), str(quota))

    def kill(self, sandbox_id: str) -> None:
        """Kill every process of the sandbox, jobs included, in every hierarchy."""
        self._require()
        self._kill_tree(self._dirs(sandbox_id))

    def remove(self, sandbox_id: str) -> None:
        """Kill, then remove the job groups and the sandbox groups (idempotent)."""
        self._require()
        dirs = self._dirs(sandbox_id)
        if not any(os.path.isdir(d) for d in dirs):
            return
        self._kill_tree(dirs)
        for d in dirs:
            self._rmdir_tree(d)

    def freeze(self, sandbox_id: str) -> None:
        """Stop every process of the sandbox until thaw()."""
        self._require()
        d = self._dirs(sandbox_id)[-1]
        self._set_frozen(d, True)
        self._wait_frozen(d)

    def thaw(self, sandbox_id: str) -> None:
        self._require()
        self._set_frozen(self._dirs(sandbox_id)[-1], False)

    def release(self) -> None:
        """Remove this service's parent groups if no sandbox is left in them (on shutdown)."""
        for base in self._bases() if self.available else []:
            try:
                os.rmdir(base)
            except OSError:
                pass            # sandboxes still live there: they keep running after the service stops

    def memory_used(self, sandbox_id: str) -> Optional[int]:
        """Bytes charged to the sandbox now, or None when unknown."""
        if "memory" not in self._limit_bases:
            return None
        name = "memory.usage_in_bytes" if self.version == 1 else "memory.current"
        text = _read(os.path.join(self._limit_bases["memory"], _check_name(sandbox_id), name))
        return int(text) if text and text.strip().isdigit() else None

    def pids(self, sandbox_id: str) -> list[int]:
        """Host pids of every process of the sandbox."""
        return sorted({pid for d in self._dirs(sandbox_id) for pid in _procs(d)}) if self.available else []

    def list(self) -> list[str]:
        """Ids of sandboxes that have cgroups (for leak checks)."""
        if not self.available:
            return []
        return sorted({os.path.basename(d) for b in self._bases() for d in _subdirs(b)})

    # ------------------------------------------------------------ jobs
    def job(self, sandbox_id: str, job: str) -> list[str]:
        """Make a fresh job group; return the cgroup.procs files that put a process in it and the sandbox."""
        self._require()
        d = self._job_dir(sandbox_id, job)
        try:
            os.mkdir(d)
        except FileExistsError:
            pass
        except OSError as e:
            raise BackendError(f"cannot create cgroup {d}: {os.strerror(e.errno or 0)}") from e
        limits = [os.path.join(x, "cgroup.procs") for x in self._dirs(sandbox_id)[:-1]]
        return limits + [os.path.join(d, "cgroup.procs")]

    def job_plan(self, sandbox_id: str, job: str) -> tuple[list[str], str]:
        """(the sandbox's cgroup.procs files, the job group to create): for a helper that makes it itself."""
        self._require()
        limits = [os.path.join(x, "cgroup.procs") for x in self._dirs(sandbox_id)[:-1]]
        return limits, self._job_dir(sandbox_id, job)

    def kill_job(self, sandbox_id: str, job: str) -> None:
        """Kill every process of one job group (its whole process tree)."""
        self._require()
        self._kill_tree([self._job_dir(sandbox_id, job)])

    def remove_job(self, sandbox_id: str, job: str) -> None:
        """Remove a job group; one still holding background processes stays until the sandbox goes."""
        self._require()
        try:
            os.rmdir(self._job_dir(sandbox_id, job))
        except OSError as e:
            if e.errno not in (errno.EBUSY, *_GONE):
                raise BackendError(f"cannot remove cgroup {self._job_dir(sandbox_id, job)}: "
                                   f"{os.strerror(e.errno or 0)}") from e

    # ------------------------------------------------------------ killing
    def _kill_tree(self, dirs: list[str]) -> None:
        """Kill everything in ``dirs`` (the kill-hierarchy dir last) and wait until they are empty."""
        top = dirs[-1]
        if not os.path.isdir(top):
            dirs = [d for d in dirs if os.path.isdir(d)]
            if not dirs:
                return
        if self.version == 2 and os.path.exists(os.path.join(top, "cgroup.kill")):
            _write(os.path.join(top, "cgroup.kill"), "1")
            if self._wait_empty(dirs, time.monotonic() + self.kill_timeout):
                return
        self._freeze_kill(dirs, top)

    def _freeze_kill(self, dirs: list[str], top: str) -> None:
        """Freeze, SIGKILL every member, thaw; repeat until empty or the deadline."""
        deadline = time.monotonic() + self.kill_timeout
        can_freeze = os.path.isdir(top)
        while True:
            if can_freeze:
                self._set_frozen(top, True)
            live = sorted({pid for d in dirs for pid in _procs(d)})
            _sigkill(live)
            if can_freeze:
                self._set_frozen(top, False)
            if not live or self._wait_empty(dirs, min(deadline, time.monotonic() + 0.05)):
                return
            if time.monotonic() > deadline:
                raise BackendError(f"processes {live[:10]} in {top} survived SIGKILL for {self.kill_timeout}s")

    @staticmethod
    def _wait_empty(dirs: Iterable[str], deadline: float) -> bool:
        delay = 0.0005
        while any(_procs(d) for d in dirs):
            if time.monotonic() > deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
        return True

    def _set_frozen(self, d: str, frozen: bool) -> None:
        try:
            if self.version == 1:
                _write(os.path.join(d, "freezer.state"), "FROZEN" if frozen else "THAWED")
            else:
                _write(os.path.join(d, "cgroup.freeze"), "1" if frozen else "0")
        except BackendError:
            if os.path.isdir(d):
                raise

    def _wait_frozen(self, d: str) -> None:
        deadline = time.monotonic() + self.kill_timeout
        while not self._is_frozen(d):
            if time.monotonic() > deadline:
                raise BackendError(f"{d} did not freeze within {self.kill_timeout}s")
            time.sleep(0.002)

    def _is_frozen(self, d: str) -> bool:
        if self.version == 1:
            return (_read(os.path.join(d, "freezer.state")) or "FROZEN").strip() == "FROZEN"
        events = _read(os.path.join(d, "cgroup.events"))
        return events is None or "frozen 1" in events

    def _rmdir_tree(self, d: str) -> None:
        """Remove a cgroup and its children, retrying briefly while dying tasks leave."""
        for sub in _subdirs(d):
            self._rmdir_tree(sub)
        deadline = time.monotonic() + self.kill_timeout
        while True:
            try:
                os.rmdir(d)
                return
            except OSError as e:
                if e.errno in _GONE:
                    return
                if e.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise BackendError(f"cannot remove cgroup {d}: {os.strerror(e.errno or 0)}") from e
                time.sleep(0.005)


def _sigkill(pids: Iterable[int]) -> None:
    for pid in pids:
        if pid > 0 and pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
