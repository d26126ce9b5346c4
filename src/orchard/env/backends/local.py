"""The local backend: each sandbox is a set of Linux namespaces made with bubblewrap, no daemon.

A sandbox is: an overlay root (image layers read-only + a private writable layer) mounted in a
private mount namespace by the native helper, bubblewrap on top of it (pid, ipc, uts, net
namespaces, /proc, /dev, no capabilities), a tiny init as pid 1, and cgroups for cpu, memory
and pids. Exec joins those namespaces through the helper; nothing runs per sandbox but init.
Sandboxes outlive the service: their metadata lives under <state_dir>/sandboxes/<id>/meta.json.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from orchard import errors
from orchard.env.backends.base import TOOLS_MOUNT, ExecOutcome, ExecSpec, ExitCallback, LiveSandbox, SandboxSpec
from orchard.env.backends.cgroups import Cgroups
from orchard.env.backends.local_forward import Forwarder, open_forwarder
from orchard.env.backends.local_fs import SandboxFS
from orchard.env.backends.local_helper import helper_path
from orchard.env.backends.local_net import SandboxNetwork
from orchard.env.backends.local_layer import drop_layer, make_layer, mounted_layers
from orchard.env.backends.local_images import Image, ImageStore
from orchard.env.backends.local_proc import Child, PidWatch, PtyHandle, readable, read_status, run_file_op, run_helper
from orchard.env.protocol import FileEntry
from orchard.env.quantities import parse_memory
from orchard.env.settings import Settings

log = logging.getLogger("orchard.env")
# Kernel knobs under /proc are root-owned files, and sandbox commands run as uid 0: bind them read-only.
PROC_READ_ONLY = [arg for path in ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs")
                  for arg in ("--ro-bind-try", path, path)]
DEFAULT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
               "LANG": "C.UTF-8", "TERM": "xterm-256color", "USER": "root"}


@dataclass
class Meta:
    """What must survive a service restart to drive a sandbox again."""

    sandbox_id: str
    pid: int                      # host pid of the sandbox's init
    start_time: str               # /proc/<pid>/stat field 22, guards against pid reuse
    image: str
    workdir: str
    env: dict[str, str]
    created_at: float
    mounts: list[str] = field(default_factory=list)   # overlay mount points, for snapshots
    cgroup_procs: list[str] = field(default_factory=list)
    has_bash: bool = True         # images without bash run shell commands under sh
    ip: Optional[str] = None      # address on the sandbox bridge when networked


class LocalBackend:
    """Sandboxes as bubblewrap namespaces on this machine."""

    name = "local"

    def __init__(self, settings: Settings):
        self.settings = settings
        self.namespace = settings.namespace
        self.root = Path(settings.state_dir) / "sandboxes"
        self.images_store = ImageStore(Path(settings.state_dir), roots=settings.image_roots)
        # one cgroup parent per state dir: two services on one host never touch each other's sandboxes
        tag = hashlib.sha256(str(Path(settings.state_dir).resolve()).encode()).hexdigest()[:8]
        self.cgroups = Cgroups(parent_name=f"orchard-{tag}")
        self.net = SandboxNetwork(Path(settings.state_dir), bridge=settings.network_bridge or f"orch{tag}",
                                  subnet=settings.network_subnet or f"10.{200 + int(tag, 16) % 50}.0.0/16")
        self._net_ready = False
        self.helper = ""
        self._helper_fd = -1
        self.bwrap = shutil.which("bwrap") or "/usr/bin/bwrap"
        self._live: dict[str, Meta] = {}
        self._pids = PidWatch(self._exited)        # sandbox id -> its init, reported when it dies
        self._forwarders: dict[str, Forwarder] = {}
        self._deleting: set[str] = set()
        self._on_exit: Optional[ExitCallback] = None
        self.settings_disk = parse_memory(settings.default_disk)

    # ------------------------------------------------------------ service lifetime
    async def start(self, on_exit: ExitCallback) -> None:
        self._on_exit = on_exit
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.settings.state_dir, 0o700)      # layers and images are root's business only
        self.helper = str(await asyncio.to_thread(helper_path, Path(self.settings.state_dir)))
        self._helper_fd = os.open(self.helper, os.O_RDONLY | os.O_CLOEXEC)   # run inside sandboxes for file I/O
        check_tools_dir(self.settings)
        if not os.path.exists(self.bwrap):
            raise errors.BackendError("bubblewrap (bwrap) is not installed: apt install bubblewrap")
        if not self.cgroups.available and self.settings.cgroups_required:
            raise errors.BackendError(f"cgroups are not usable ({self.cgroups.why}); "
                                      "set ORCHARD_CGROUPS_REQUIRED=false to run without limits")

    async def close(self) -> None:
        self._pids.close()
        for fwd in self._forwarders.values():
            await fwd.close()
        self._forwarders.clear()
        self.cgroups.release()
        if self._net_ready and not self.net.owners():   # no networked sandbox left: take the bridge down
            await asyncio.to_thread(self.net.teardown)

    # ------------------------------------------------------------ create
    async def create(self, spec: SandboxSpec) -> None:
        image = await asyncio.to_thread(self.images_store.resolve, spec.image)
        home = self.root / spec.sandbox_id
        if home.exists():
            raise errors.ConflictError(f"Sandbox {spec.sandbox_id} already exists on this host")
        size = spec.disk or self.settings_disk
        overlays = await asyncio.to_thread(_layout, home, image, size, self.settings.writable_layer == "tmpfs")
        procs = await asyncio.to_thread(self._cgroup, spec)    # memory cgroup creation can sleep in the kernel
        pid = await self._spawn(spec, image, home, overlays, procs)
        ip = None if spec.block_network else await self._connect(spec.sandbox_id, pid)
        meta = Meta(sandbox_id=spec.sandbox_id, pid=pid, start_time=_start_time(pid), image=spec.image,
                    workdir=image.workdir, env={**DEFAULT_ENV, **image.env}, created_at=spec.created_at,
                    mounts=list(image.layers), cgroup_procs=procs, has_bash=_has_bash(pid), ip=ip)
        await asyncio.to_thread(_write_meta, home, meta)
        self._track(meta)
        await self._forward(spec)

    async def _connect(self, sandbox_id: str, pid: int) -> str:
        """Give a networked sandbox its veth on the bridge (outbound NAT only; the host and peers unreachable)."""
        if not self.net.available:
            raise errors.SandboxFailedError(f"Networked sandboxes are unavailable here: {self.net.why}")
        if not self._net_ready:
            await asyncio.to_thread(self.net.setup)
            self._net_ready = True
        try:
            return await asyncio.to_thread(self.net.attach, sandbox_id, pid)
        except errors.OrchardError as e:
            raise errors.SandboxFailedError(f"Network setup failed: {e.detail}") from e

    def _cgroup(self, spec: SandboxSpec) -> list[str]:
        if not self.cgroups.available:
            return []
        return self.cgroups.create(spec.sandbox_id, spec.cpu, spec.memory, spec.pids)

    async def _spawn(self, spec: SandboxSpec, image: Image, home: Path, overlays: list[str],
                     procs: list[str]) -> int:
        argv = [self.helper, "mount", *_flags("--cgroup", procs), *overlays, "--", *self._bwrap_args(spec, image, home)]
        info_r, info_w = os.pipe2(os.O_CLOEXEC)
        helper_fd = os.open(self.helper, os.O_RDONLY | os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
        fds = {"{INFO}": str(info_w), "{HELPER}": str(helper_fd), "{READY}": str(ready_w)}
        try:
            proc = await Child.start([_fill(a, fds) for a in argv], {}, subprocess.DEVNULL, subprocess.DEVNULL,
                                     err_w, (info_w, helper_fd, ready_w), new_session=True)
        finally:
            for fd in (info_w, helper_fd, err_w, ready_w):
                os.close(fd)
        try:
            info = await read_status(info_r, timeout=30.0)
            ready = await read_status(ready_r, timeout=30.0)    # init runs only once bubblewrap set everything up
            return await _child_pid(proc, info if ready.startswith(b"ready") else b"", err_r)
        finally:
            for fd in (info_r, ready_r, err_r):
                os.close(fd)

    def _bwrap_args(self, spec: SandboxSpec, image: Image, home: Path) -> list[str]:
        args = [self.bwrap, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
                "--hostname", spec.sandbox_id,
                "--bind", str(home / "rootfs"), "/", "--proc", "/proc", *PROC_READ_ONLY, "--dev", "/dev",
                "--dir", image.workdir, "--chdir", "/", "--as-pid-1", "--info-fd", "{INFO}"]
        if self.settings.tools_dir is not None:
            args += ["--ro-bind", str(self.settings.tools_dir), TOOLS_MOUNT]
        return args + ["--", "/proc/self/fd/{HELPER}", "init", "{READY}"]

    def _track(self, meta: Meta) -> None:
        self._live[meta.sandbox_id] = meta
        self._pids.watch(meta.sandbox_id, meta.pid)

    def _exited(self, sandbox_id: str) -> None:
        if sandbox_id in self._deleting or self._on_exit is None:
            return
        asyncio.create_task(self._on_exit(sandbox_id, "The sandbox's processes were killed or exited"))

    async def _forward(self, spec: SandboxSpec) -> None:
        if spec.model_endpoint is None:
            return
        port, host, hport = spec.model_endpoint
        meta = self._meta(spec.sandbox_id)
        self._forwarders[spec.sandbox_id] = await open_forwarder(meta.pid, port, host, hport)

    async def adopt(self, spec: SandboxSpec) -> bool:
        meta = _read_meta(self.root / spec.sandbox_id)
        if meta is None or not _alive(meta):
            return False
        self._track(meta)
        try:
            await self._forward(spec)
        except errors.OrchardError as e:
            log.warning("re-opening the model endpoint of %s failed: %s", spec.sandbox_id, e.detail)
        return True

    # ------------------------------------------------------------ delete
    async def delete(self, sandbox_id: str) -> None:
        self._deleting.add(sandbox_id)
        try:
            await self._teardown(sandbox_id)
        finally:
            self._deleting.discard(sandbox_id)

    async def _teardown(self, sandbox_id: str) -> None:
        fwd = self._forwarders.pop(sandbox_id, None)
        if fwd is not None:
            await fwd.close()
        self._pids.unwatch(sandbox_id)
        home = self.root / sandbox_id
        meta = self._live.pop(sandbox_id, None) or _read_meta(home)
        if meta is not None and _alive(meta):
            await _kill_and_wait(meta.pid)      # pid 1 of the sandbox: the kernel takes every process with it
        await asyncio.to_thread(self._release, sandbox_id, home)

    def _release(self, sandbox_id: str, home: Path) -> None:
        """Unmount, remove cgroups and files: kernel work that may sleep, so it runs off the event loop."""
        self.net.detach(sandbox_id)
        drop_layer(home / "layer")              # frees the writable layer before its memory cgroup goes
        if self.cgroups.available:
            self.cgroups.remove(sandbox_id)
        shutil.rmtree(home, True)

    async def list_live(self) -> Optional[list[LiveSandbox]]:
        try:
            homes = list(self.root.iterdir())
        except OSError:
            return None
        found = {}
        for home in homes:
            meta = _read_meta(home)
            created = meta.created_at if meta else home.stat().st_mtime
            found[home.name] = LiveSandbox(home.name, created, alive=bool(meta and _alive(meta)))
        for sid in (self.cgroups.list() if self.cgroups.available else []):
            found.setdefault(sid, LiveSandbox(sid, 0.0, alive=False))
        return list(found.values())

    def inventory(self) -> dict[str, set[str]]:
        """Everything this backend holds on the host, by sandbox id: dir, process, mount, cgroup."""
        found: dict[str, set[str]] = {}
        for home in self.root.iterdir() if self.root.is_dir() else []:
            kinds = found.setdefault(home.name, {"dir"})
            meta = _read_meta(home)
            if meta is not None and _alive(meta):
                kinds.add("process")
        for layer in mounted_layers(self.root):
            found.setdefault(layer.parent.name, set()).add("mount")
        for sid in self.cgroups.list() if self.cgroups.available else []:
            found.setdefault(sid, set()).add("cgroup")
        for sid in self.net.owners():
            found.setdefault(sid, set()).add("network")
        return found

    # ------------------------------------------------------------ exec
    def _meta(self, sandbox_id: str) -> Meta:
        meta = self._live.get(sandbox_id)
        if meta is None or (sandbox_id not in self._pids and not _alive(meta)):
            # another service on this state dir (a replica) started it, or deleted and started it again
            meta = _read_meta(self.root / sandbox_id)
            if meta is None or not _alive(meta):
                raise errors.SandboxNotFoundError(f"Sandbox {sandbox_id} is not running on this host")
            self._live[sandbox_id] = meta
        return meta

    def _env(self, meta: Meta, extra: dict[str, str]) -> dict[str, str]:
        return {**meta.env, **extra}

    async def exec(self, sandbox_id: str, spec: ExecSpec) -> ExecOutcome:
        meta = self._meta(sandbox_id)
        job = uuid.uuid4().hex[:12]
        try:
            return await run_helper(self._enter(meta, spec.cwd, self._job_flags(sandbox_id, job), spec.argv),
                                    self._env(meta, spec.env), spec, kill_tree=lambda: self._kill_job(sandbox_id, job))
        finally:
            self._forget_job(sandbox_id, job)

    def _job_flags(self, sandbox_id: str, job: str) -> list[str]:
        """The helper joins the sandbox's groups and creates the job's own (tree-kill) group itself."""
        if not self.cgroups.available:
            return []
        limits, job_dir = self.cgroups.job_plan(sandbox_id, job)
        return [*_flags("--cgroup", limits), "--cgroup-new", job_dir]

    def _forget_job(self, sandbox_id: str, job: str) -> None:
        if self.cgroups.available:      # an rmdir in cgroupfs may sleep: not on the event loop
            asyncio.get_running_loop().run_in_executor(None, self.cgroups.remove_job, sandbox_id, job)

    def _enter(self, meta: Meta, cwd: Optional[str], flags: list[str], argv: list[str]) -> list[str]:
        if argv[0] == "bash" and not meta.has_bash:
            argv = ["sh"] + ["-l" if arg == "--login" else arg for arg in argv[1:]]
        return [self.helper, "enter", str(meta.pid), cwd or meta.workdir, *flags, "--", *argv]

    async def _kill_job(self, sandbox_id: str, job: str) -> None:
        if self.cgroups.available:
            await asyncio.to_thread(self.cgroups.kill_job, sandbox_id, job)

    async def open_pty(self, sandbox_id: str, argv: list[str], cwd: Optional[str], env: dict[str, str],
                       rows: int, cols: int) -> PtyHandle:
        meta = self._meta(sandbox_id)
        job = uuid.uuid4().hex[:12]

        async def end() -> None:
            await self._kill_job(sandbox_id, job)
            self._forget_job(sandbox_id, job)

        argv = self._enter(meta, cwd, self._job_flags(sandbox_id, job), argv)
        return await PtyHandle.start(argv, self._env(meta, env), rows, cols, end)

    # ------------------------------------------------------------ files
    def _fs(self, sandbox_id: str) -> SandboxFS:
        return SandboxFS(f"/proc/{self._meta(sandbox_id).pid}/root")

    async def read_file(self, sandbox_id: str, path: str, limit: int) -> bytes:
        code, out, err, status = await self._file_op(sandbox_id, ["get", path, str(limit)], None, limit)
        if code == 0 and len(out) <= limit:
            return out
        raise _file_error(code, err, status, path, limit)

    async def write_file(self, sandbox_id: str, path: str, data: bytes, mode: Optional[int]) -> None:
        code, _, err, status = await self._file_op(sandbox_id, ["put", path, str(-1 if mode is None else mode)], data, 0)
        if code != 0:
            raise _file_error(code, err, status, path, len(data))

    async def _file_op(self, sandbox_id: str, args: list[str], data: Optional[bytes], limit: int):
        """Files move through the helper run *inside* the sandbox: its view, its user, its cgroups."""
        meta = self._meta(sandbox_id)
        argv = self._enter(meta, "/", _flags("--cgroup", meta.cgroup_procs), [f"/proc/self/fd/{self._helper_fd}", *args])
        return await run_file_op(argv, self._env(meta, {}), data, limit, self._helper_fd)

    async def list_dir(self, sandbox_id: str, path: str) -> list[FileEntry]:
        return await asyncio.to_thread(self._fs(sandbox_id).list, path)

    # ------------------------------------------------------------ snapshot
    async def snapshot(self, sandbox_id: str, image: str) -> int:
        meta = self._meta(sandbox_id)
        base = await asyncio.to_thread(self.images_store.resolve, meta.image)
        home = self.root / sandbox_id
        uppers = {mp: str(home / "layer" / "upper" / _escape(mp)) for mp in meta.mounts}
        if self.cgroups.available:
            await asyncio.to_thread(self.cgroups.freeze, sandbox_id)
        try:
            return await asyncio.to_thread(self.images_store.snapshot, image, base, uppers)
        finally:
            if self.cgroups.available:
                await asyncio.to_thread(self.cgroups.thaw, sandbox_id)

    # ------------------------------------------------------------ facts
    async def workdir(self, sandbox_id: str) -> str:
        meta = self._live.get(sandbox_id)
        return meta.workdir if meta else "/workspace"

    def images(self) -> list[str]:
        return self.images_store.names()

    def capacity(self) -> tuple[float, int]:
        return float(os.cpu_count() or 1), os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def memory_used(self, sandbox_id: str) -> Optional[int]:
        return self.cgroups.memory_used(sandbox_id) if self.cgroups.available else None


# ---------------------------------------------------------------- helpers
def check_tools_dir(settings: Settings) -> None:
    """A tools_dir that is set must exist: every sandbox would otherwise fail to start."""
    if settings.tools_dir is not None and not settings.tools_dir.is_dir():
        raise errors.BackendError(f"tools_dir {settings.tools_dir} is not a directory "
                                  "(run `orchard harness install --tools-dir DIR` or unset ORCHARD_TOOLS_DIR)")


def _file_error(code: Optional[int], err: str, status: dict[str, str], path: str, size: int) -> errors.OrchardError:
    if status.get("err"):
        return errors.BackendError(f"Could not reach {path} in the sandbox: {status['err']}")
    message = err or f"{path}: file operation failed (exit {code})"
    if code == 2:
        return errors.NotFoundError(f"File not found: {path}")
    if code == 3:
        return errors.RequestError(message, status_code=400)
    if code == 4:
        return errors.PayloadTooLargeError(f"{message} (limit {size} bytes, or no space left in the sandbox)")
    if code in (-9, 137):
        return errors.PayloadTooLargeError(f"{path}: killed by the sandbox's memory limit while writing {size} bytes")
    return errors.RequestError(message, status_code=400)


def _fill(arg: str, fds: dict[str, str]) -> str:
    for placeholder, fd in fds.items():
        arg = arg.replace(placeholder, fd)
    return arg


def _flags(flag: str, values: list[str]) -> list[str]:
    return [part for value in values for part in (flag, value)]


def _escape(mount_point: str) -> str:
    return "root" if mount_point == "/" else mount_point.strip("/").replace("/", "_")


def _layout(home: Path, image: Image, size: Optional[int], tmpfs: bool) -> list[str]:
    """Make the writable layer and return the helper's --overlay arguments (root first)."""
    rootfs = home / "rootfs"
    rootfs.mkdir(parents=True)
    layer = home / "layer"
    make_layer(layer, size, tmpfs)
    args: list[str] = []
    for mount_point in sorted(image.layers, key=lambda mp: (mp != "/", mp)):
        upper, work = layer / "upper" / _escape(mount_point), layer / "work" / _escape(mount_point)
        upper.mkdir(parents=True)
        work.mkdir(parents=True)
        target = rootfs if mount_point == "/" else rootfs / mount_point.lstrip("/")
        args += ["--overlay", str(target), ":".join(image.layers[mount_point]), str(upper), str(work)]
    return args


async def _child_pid(proc: Child, info: bytes, err_fd: int) -> int:
    try:
        pid = int(json.loads(info)["child-pid"])
        asyncio.ensure_future(proc.wait())      # bubblewrap's monitor exits with the sandbox: reap it then
        return pid
    except (ValueError, KeyError):
        pass
    proc.kill()
    await proc.wait()
    stderr = await read_status(err_fd, 1.0)
    message = stderr.decode("utf-8", "replace").strip() or f"exit code {proc.returncode}"
    raise errors.SandboxFailedError(f"Sandbox failed to start: {message}")


def _has_bash(pid: int) -> bool:
    fs = SandboxFS(f"/proc/{pid}/root")
    return any(fs.stat_kind(path) == "file" for path in ("/bin/bash", "/usr/bin/bash"))


def _start_time(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _alive(meta: Meta) -> bool:
    return bool(meta.start_time) and _start_time(meta.pid) == meta.start_time


async def _kill_and_wait(pid: int, timeout: float = 10.0) -> None:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        await asyncio.wait_for(readable(fd), timeout)
    except (ProcessLookupError, asyncio.TimeoutError):
        pass
    finally:
        os.close(fd)


def _write_meta(home: Path, meta: Meta) -> None:
    tmp = home / "meta.json.tmp"
    tmp.write_text(json.dumps(asdict(meta)))
    os.replace(tmp, home / "meta.json")


def _read_meta(home: Path) -> Optional[Meta]:
    try:
        return Meta(**json.loads((home / "meta.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None
