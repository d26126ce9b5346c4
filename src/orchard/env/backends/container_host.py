"""Reach a container from this host: whether its init can be entered, its cgroups, and per-job groups for tree-kill.

The fast path of the container backend treats a container like a local sandbox: the helper
joins the namespaces of the container's init (State.Pid) and its cgroups. A job gets its own
group under the container's group in the kill hierarchy (the freezer on cgroup v1, the unified
hierarchy on v2), so a timeout kills exactly its process tree; it is still charged to the
container's memory, pids and cpu groups, which it joins too.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass
from typing import Optional

JOB_PREFIX = "orchard-job-"


def enterable(pid: int, container_id: str) -> bool:
    """pid is visible here, is that container's process (its cgroup names the id), and we may join it."""
    if pid <= 0 or os.geteuid() != 0:
        return False
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            if container_id not in f.read():
                return False
        os.close(os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC))
        return True
    except OSError:
        return False


@dataclass
class ContainerCgroups:
    """The host directories of one container's cgroups."""

    join: list[str]               # groups a job joins as they are (limits, accounting)
    kill_dir: str                 # the group under which jobs get their own child group
    unified: bool                 # kill_dir is in a cgroup v2 hierarchy
    memory_dir: Optional[str]

    @classmethod
    def of(cls, pid: int, container_id: str) -> Optional["ContainerCgroups"]:
        """The cgroups of the container whose init is pid, or None when they are not writable here."""
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                lines = f.read().splitlines()
            with open("/proc/self/mountinfo") as f:
                mounts = _cgroup_mounts(f.read())
        except OSError:
            return None
        dirs = _container_dirs(lines, mounts)
        kill = dirs.pop("freezer", None) or (dirs.pop("", None) if "" in dirs and len(dirs) == 1 else None)
        if kill is None or container_id not in kill or not os.access(kill, os.W_OK):
            return None
        unified = _is_unified(kill, mounts)
        memory = dirs.get("memory") or (kill if unified else None)
        return cls(join=sorted(set(dirs.values())), kill_dir=kill, unified=unified, memory_dir=memory)

    def job_dir(self, job: str) -> str:
        return os.path.join(self.kill_dir, JOB_PREFIX + job)

    def job_flags(self, job: str) -> list[str]:
        """Helper flags: join the container's groups and create the job's own group."""
        return [*_flags(self.join), "--cgroup-new", self.job_dir(job)]

    def join_flags(self) -> list[str]:
        """Helper flags: join the container's groups (file transfers: no job group)."""
        return _flags([*self.join, self.kill_dir])

    def kill_job(self, job: str, timeout: float = 10.0) -> None:
        """SIGKILL every process of the job group (its whole tree), waiting until it is empty."""
        d = self.job_dir(job)
        if not os.path.isdir(d):
            return
        if self.unified and os.path.exists(os.path.join(d, "cgroup.kill")):
            _write(os.path.join(d, "cgroup.kill"), "1")
        deadline = time.monotonic() + timeout
        while True:
            self._freeze(d, True)
            live = _procs(d)
            for pid in live:
                _kill(pid)
            self._freeze(d, False)
            if not live or time.monotonic() > deadline:
                return
            time.sleep(0.005)

    def remove_job(self, job: str) -> None:
        """Remove the job group; one still holding background processes stays until the container goes."""
        try:
            os.rmdir(self.job_dir(job))
        except OSError as e:
            if e.errno not in (errno.EBUSY, errno.ENOENT, errno.ENODEV):
                raise

    def memory_used(self) -> Optional[int]:
        if not self.memory_dir:
            return None
        for name in ("memory.current", "memory.usage_in_bytes"):
            try:
                with open(os.path.join(self.memory_dir, name)) as f:
                    return int(f.read().strip())
            except (OSError, ValueError):
                continue
        return None

    def _freeze(self, d: str, frozen: bool) -> None:
        if self.unified:
            _write(os.path.join(d, "cgroup.freeze"), "1" if frozen else "0")
        else:
            _write(os.path.join(d, "freezer.state"), "FROZEN" if frozen else "THAWED")


def _flags(procs_dirs: list[str]) -> list[str]:
    return [part for d in procs_dirs for part in ("--cgroup", os.path.join(d, "cgroup.procs"))]


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _cgroup_mounts(mountinfo: str) -> list[tuple[set[str], str, str]]:
    """(controllers, mount point, root the mount shows) of every cgroup mount; controllers {''} for v2."""
    found = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        controllers = {""} if tail[0] == "cgroup2" else set(tail[2].split(","))
        found.append((controllers, _unescape(fields[4]), _unescape(fields[3])))
    return found


def _container_dirs(lines: list[str], mounts: list[tuple[set[str], str, str]]) -> dict[str, str]:
    """controller name ('' for v2) -> host directory of the process's group, for hierarchies mounted here."""
    dirs: dict[str, str] = {}
    for line in lines:
        _, names, path = line.split(":", 2)
        wanted = set(names.split(",")) if names else {""}
        for controllers, point, root in mounts:
            if wanted <= controllers:
                rel = path[len(root):] if root != "/" and path.startswith(root) else path
                d = os.path.join(point, rel.lstrip("/"))
                if os.path.isdir(d):
                    for name in wanted:
                        dirs[name] = d
                break
    return dirs


def _is_unified(d: str, mounts: list[tuple[set[str], str, str]]) -> bool:
    return any(controllers == {""} and (d + "/").startswith(point.rstrip("/") + "/")
               for controllers, point, _ in mounts)


def _procs(d: str) -> list[int]:
    pids: list[int] = []
    for top, dirs, _ in os.walk(d):
        try:
            with open(os.path.join(top, "cgroup.procs")) as f:
                pids += [int(p) for p in f.read().split()]
        except OSError:
            continue
    return pids


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _write(path: str, value: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError:
        pass                     # the group is already gone, or this kernel lacks the knob
