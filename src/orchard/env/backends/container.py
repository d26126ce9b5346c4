"""The container backend: one container per sandbox through the Docker Engine API (Docker, or Podman's socket).

A sandbox is a container labelled ``orchard.sandbox=<id>`` and ``orchard.service=<tag>`` (the tag
is a digest of the state dir, or with a shared store of its Redis URL, so two services never touch
each other's containers while the replicas of one service share them), started from
a real OCI image (pulled only when missing) with every capability dropped, no_new_privs, cpu,
memory and pids limits, and no network unless asked. Its command only keeps it alive: the static
helper's ``init`` (bind-mounted read-only at /.orchard/init, so images without ``sleep`` work)
when the engine runs on this host, else ``sleep infinity`` under the engine's ``--init``.

Two ways in. Fast path, when the engine runs on this host (the container's init pid is visible
here and its namespaces can be joined): exec, PTY and files go through the same helper as the
local backend (namespaces, no capabilities, seccomp, a per-job cgroup under the container's for
tree-kill), and listings use openat2 on /proc/<pid>/root. Otherwise the engine API: exec
create/start, archive get/put, and a marker-based kill (see container_api.py).

Several replicas sharing one store and one engine: a replica asked about a sandbox another one created
attaches to its container on first use (one engine lookup per sandbox and replica, shared by concurrent
first uses) and forgets the handle when the container stops or the engine no longer knows it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional
from urllib.parse import urlparse

import docker
import docker.errors
import docker.types

from orchard import errors
from orchard.env.backends import container_api
from orchard.env.backends.base import TOOLS_MOUNT, ExecOutcome, ExecSpec, ExitCallback, LiveSandbox, PtyProcess, SandboxSpec
from orchard.env.backends.container_host import ContainerCgroups, enterable
from orchard.env.backends.container_images import (HOST_REPOSITORY, SNAPSHOT_REPOSITORY, ensure_host_image,
                                                   snapshot_reference)
from orchard.env.backends.local import _file_error           # the helper's put/get exit codes, mapped once
from orchard.env.backends.local import check_tools_dir
from orchard.env.backends.local_forward import Forwarder, open_forwarder
from orchard.env.backends.local_fs import SandboxFS
from orchard.env.backends.local_helper import helper_path
from orchard.env.backends.local_net import SandboxNetwork
from orchard.env.backends.local_net import _run as run_tool
from orchard.env.backends.local_proc import PidWatch, PtyHandle, run_file_op, run_helper
from orchard.env.backends.single_flight import SingleFlight
from orchard.env.protocol import FileEntry
from orchard.env.settings import Settings

log = logging.getLogger("orchard.env")
INIT_PATH = "/.orchard/init"
DEFAULT_WORKDIR = "/workspace"
DEFAULT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
               "LANG": "C.UTF-8", "TERM": "xterm-256color", "USER": "root"}
POLL_INTERVAL = 2.0          # seconds between engine listings that notice deaths of containers no pidfd watches


@dataclass
class Box:
    """What the backend knows of one sandbox's container."""

    sandbox_id: str
    container_id: str
    workdir: str
    env: dict[str, str]
    has_bash: bool = True
    pid: int = 0                                  # host pid of its init when the engine runs here (else 0)
    cgroups: Optional[ContainerCgroups] = None    # set exactly when the fast path is used
    networked: bool = False

    @property
    def fast(self) -> bool:
        return self.cgroups is not None


class ContainerBackend:
    """Sandboxes as containers of a Docker-API engine."""

    name = "container"

    def __init__(self, settings: Settings):
        self.settings = settings
        self.namespace = settings.namespace
        self.tag = service_tag(settings)
        self.network = f"orchard-{self.tag}"
        self.net = SandboxNetwork(Path(settings.state_dir), bridge=settings.network_bridge or f"orcc{self.tag}",
                                  subnet=settings.network_subnet or f"10.{150 + int(self.tag, 16) % 50}.0.0/16")
        self.client: Optional[docker.DockerClient] = None
        self.here = False                 # the engine runs on this host: its containers' pids are ours to watch
        self.fast_exec = False            # ...and exec, PTY and files go through the helper (container_exec=auto)
        self.helper = ""
        self._helper_fd = -1
        self._boxes: dict[str, Box] = {}
        self._attaching: SingleFlight[Box] = SingleFlight()
        self._pids = PidWatch(self._report_exit)   # sandbox id -> its container's init, when visible here
        self._forwarders: dict[str, Forwarder] = {}
        self._deleting: set[str] = set()
        self._on_exit: Optional[ExitCallback] = None
        self._poller: Optional[asyncio.Task] = None
        self._capacity = (float(os.cpu_count() or 1), os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        self._disk_quota = True           # the storage driver takes a size (unknown until tried)
        self._net_ready = False
        self._net_lock = asyncio.Lock()
        self._host_image: Optional[str] = None

    @property
    def api(self) -> docker.APIClient:
        assert self.client is not None, "start() first"
        return self.client.api

    # ------------------------------------------------------------ service lifetime
    async def start(self, on_exit: ExitCallback) -> None:
        self._on_exit = on_exit
        Path(self.settings.state_dir).mkdir(parents=True, exist_ok=True)
        check_tools_dir(self.settings)
        try:
            self.client, info = await asyncio.to_thread(self._connect)
        except (docker.errors.DockerException, OSError) as e:
            raise errors.BackendError(f"Cannot reach the container engine at {self.settings.docker_host}: {e}") from e
        self._capacity = (float(info.get("NCPU") or self._capacity[0]), int(info.get("MemTotal") or self._capacity[1]))
        self.here = _engine_here(self.settings.docker_host, info)
        if self.here:
            await self._prepare_helper()
        self.fast_exec = bool(self.helper) and self.settings.container_exec == "auto"
        self._poller = asyncio.create_task(self._poll_exits())

    def _connect(self) -> tuple[docker.DockerClient, dict]:
        client = docker.DockerClient(base_url=self.settings.docker_host, timeout=300, max_pool_size=64)
        return client, client.info()

    async def _prepare_helper(self) -> None:
        try:
            self.helper = str(await asyncio.to_thread(helper_path, Path(self.settings.state_dir)))
            self._helper_fd = os.open(self.helper, os.O_RDONLY | os.O_CLOEXEC)
        except errors.OrchardError as e:
            log.warning("no fast path for containers (%s): using the engine API for exec and files", e.detail)
            self.helper = ""

    async def close(self) -> None:
        self._attaching.cancel()
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        self._pids.close()
        for fwd in self._forwarders.values():
            await fwd.close()
        self._forwarders.clear()
        if self._net_ready and not any(b.networked for b in self._boxes.values()):
            await asyncio.to_thread(self._drop_network)
        if self.client is not None:
            self.client.close()
        if self._helper_fd >= 0:
            os.close(self._helper_fd)
            self._helper_fd = -1

    # ------------------------------------------------------------ create
    async def create(self, spec: SandboxSpec) -> None:
        image = await asyncio.to_thread(self._resolve, spec.image)
        config = await asyncio.to_thread(self._image_config, image)
        network = "none" if spec.block_network else await self._ensure_network()
        container = await asyncio.to_thread(self._start_container, spec, image, config, network)
        try:
            box = await asyncio.to_thread(self._inspect_box, spec.sandbox_id, container, config)
            await asyncio.to_thread(self._writable_root, box)
            self._track(box)
            await self._forward(spec)
        except BaseException:
            await self.delete(spec.sandbox_id)
            raise

    def _resolve(self, name: str) -> str:
        """The image reference to start for a name the service hands over; pulls what is missing."""
        if name == "host":
            if self._host_image is None or not self._has_image(self._host_image):
                self._host_image = ensure_host_image(self.api)      # built once; a restart notices new packages
            return self._host_image
        if name.startswith("@"):
            ref = snapshot_reference(name, self.tag)
            if not self._has_image(ref):
                raise errors.NotFoundError(self._unknown(name.split("/", 1)[-1], ": no such snapshot"))
            return ref
        if name.startswith(SNAPSHOT_REPOSITORY + "/"):
            raise errors.NotFoundError(self._unknown(name, ": snapshots are named by their owners' names"))
        if not self._has_image(name):
            self._pull(name)
        return name

    def _has_image(self, ref: str) -> bool:
        try:
            self.api.inspect_image(ref)
            return True
        except docker.errors.ImageNotFound:
            return False
        except docker.errors.APIError as e:
            raise errors.SandboxFailedError(self._unknown(ref, f": {_why(e)}")) from e

    def _pull(self, name: str) -> None:
        repository, tag = _split_reference(name)
        try:
            for line in self.api.pull(repository, tag=tag, stream=True, decode=True):
                if "error" in line:
                    raise errors.SandboxFailedError(self._unknown(name, f": pull failed: {line['error'][-300:]}"))
        except docker.errors.APIError as e:
            raise errors.SandboxFailedError(self._unknown(name, f": pull failed: {_why(e)}")) from e
        if not self._has_image(name):
            raise errors.SandboxFailedError(self._unknown(name, ": the pull ended without the image"))

    def _unknown(self, name: str, why: str = "") -> str:
        local = [n for n in self.images() if n != "host"]
        tail = f", local images: {', '.join(local)}" if local else ""
        return f"Unknown image {name!r}{why}. Available: host, your snapshots{tail}"

    def _image_config(self, ref: str) -> dict:
        return self.api.inspect_image(ref).get("Config") or {}

    def _start_container(self, spec: SandboxSpec, image: str, config: dict, network: str):
        name = self._container_name(spec.sandbox_id)
        try:
            self.api.inspect_container(name)
            raise errors.ConflictError(f"Sandbox {spec.sandbox_id} already exists on this engine")
        except docker.errors.NotFound:
            pass
        kwargs = self._create_args(spec, image, config, network)
        try:
            container = self._create(kwargs)
            container.start()
        except docker.errors.APIError as e:
            self._remove(name)
            raise errors.SandboxFailedError(f"Sandbox failed to start: {_why(e)}") from e
        return container

    def _create(self, kwargs: dict):
        if self._disk_quota and "storage_opt" in kwargs:
            try:
                return self.client.containers.create(**kwargs)
            except docker.errors.APIError as e:
                if "storage-opt" not in _why(e) and "quota" not in _why(e):
                    raise
                log.warning("the engine's storage cannot limit a container's disk (%s): "
                            "writable layers are unbounded", _why(e)[-200:])
                self._disk_quota = False
        kwargs.pop("storage_opt", None)
        return self.client.containers.create(**kwargs)

    def _create_args(self, spec: SandboxSpec, image: str, config: dict, network: str) -> dict:
        kwargs = dict(
            image=image, name=self._container_name(spec.sandbox_id), hostname=spec.sandbox_id, detach=True,
            labels={"orchard.sandbox": spec.sandbox_id, "orchard.service": self.tag,
                    "orchard.namespace": self.namespace, "orchard.created": repr(spec.created_at)},
            working_dir=config.get("WorkingDir") or DEFAULT_WORKDIR, network_mode=network,
            cap_drop=["ALL"], security_opt=["no-new-privileges"], pids_limit=spec.pids or -1)
        if spec.cpu:
            kwargs["nano_cpus"] = int(spec.cpu * 1e9)
        if spec.memory:
            kwargs["mem_limit"] = kwargs["memswap_limit"] = spec.memory
        if spec.disk:
            kwargs["storage_opt"] = {"size": str(spec.disk)}
        if self.helper:
            kwargs.update(entrypoint=[INIT_PATH], command=["init"], mounts=[docker.types.Mount(
                INIT_PATH, self.helper, type="bind", read_only=True)])
        else:
            kwargs.update(entrypoint=["sleep"], command=["infinity"], init=True)
        if self.settings.tools_dir is not None:
            kwargs.setdefault("mounts", []).append(docker.types.Mount(
                TOOLS_MOUNT, str(self.settings.tools_dir), type="bind", read_only=True))
        return kwargs

    def _container_name(self, sandbox_id: str) -> str:
        return f"orchard-{self.tag}-{sandbox_id}"

    def _inspect_box(self, sandbox_id: str, container, config: Optional[dict] = None) -> Box:
        """Read what the engine says of a started container; fail with why when it is not running."""
        info = self.api.inspect_container(container.id if hasattr(container, "id") else container)
        state = info.get("State") or {}
        if not state.get("Running"):
            why = state.get("Error") or f"it exited with code {state.get('ExitCode')}"
            raise errors.SandboxFailedError(f"Sandbox failed to start: {why}")
        if config is None:
            config = self._image_config(info["Image"])
        env = dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item)
        networks = (info.get("NetworkSettings") or {}).get("Networks") or {}
        box = Box(sandbox_id=sandbox_id, container_id=info["Id"], workdir=info["Config"].get("WorkingDir") or "/",
                  env={**DEFAULT_ENV, **env}, networked=self.network in networks)
        pid = int(state.get("Pid") or 0)
        if self.here and enterable(pid, box.container_id):
            box.pid = pid
            box.cgroups = ContainerCgroups.of(pid, box.container_id) if self.fast_exec else None
        box.has_bash = self._has_bash(box)
        return box

    def _writable_root(self, box: Box) -> None:
        """Podman's storage makes a container's / mode 0555, which capability-less root cannot write: make it 0755
        (through the engine, as `docker cp` would, so it works on either path)."""
        if box.pid:
            mode = os.stat(f"/proc/{box.pid}/root").st_mode
        else:
            mode = (container_api.path_stat(self.api, box.container_id, "/") or {}).get("mode", 0o755)
        if not mode & 0o200:
            container_api.set_root_mode(self.api, box.container_id, 0o755)

    def _has_bash(self, box: Box) -> bool:
        if box.pid:
            fs = SandboxFS(f"/proc/{box.pid}/root")
            return any(fs.stat_kind(p) == "file" for p in ("/bin/bash", "/usr/bin/bash"))
        return any(container_api.path_stat(self.api, box.container_id, p) for p in ("/bin/bash", "/usr/bin/bash"))

    def _track(self, box: Box) -> None:
        self._boxes[box.sandbox_id] = box
        if box.pid:
            self._pids.watch(box.sandbox_id, box.pid)

    def _report_exit(self, sandbox_id: str) -> None:
        if sandbox_id in self._deleting or self._on_exit is None or self._boxes.pop(sandbox_id, None) is None:
            return
        asyncio.create_task(self._on_exit(sandbox_id, "The sandbox's container stopped or was removed"))

    async def _poll_exits(self) -> None:
        """For containers the fast path cannot watch: notice on a timer when they stop."""
        while True:
            await asyncio.sleep(POLL_INTERVAL)
            watched = [sid for sid, box in self._boxes.items() if sid not in self._pids]
            if not watched:
                continue
            live = await self.list_live()
            if live is None:
                continue                     # the engine did not answer: never report deaths on an error
            running = {s.sandbox_id for s in live if s.alive}
            for sid in watched:
                if sid not in running:
                    self._report_exit(sid)

    async def _forward(self, spec: SandboxSpec) -> None:
        if spec.model_endpoint is None:
            return
        box = self._box(spec.sandbox_id)
        port, host, hport = spec.model_endpoint
        if not box.pid:
            raise errors.SandboxFailedError("model_endpoint needs the container engine on this host")
        self._forwarders[spec.sandbox_id] = await open_forwarder(box.pid, port, host, hport)

    async def adopt(self, spec: SandboxSpec) -> bool:
        try:
            box = await asyncio.to_thread(self._inspect_box, spec.sandbox_id, self._container_name(spec.sandbox_id))
        except (docker.errors.NotFound, errors.SandboxFailedError):
            return False
        except docker.errors.APIError as e:
            log.warning("adopting %s: the engine failed: %s", spec.sandbox_id, _why(e))
            return False
        self._track(box)
        try:
            await self._forward(spec)
        except errors.OrchardError as e:
            log.warning("re-opening the model endpoint of %s failed: %s", spec.sandbox_id, e.detail)
        return True

    # ------------------------------------------------------------ network
    async def _ensure_network(self) -> str:
        """The service's bridge network; on this host, nftables keeps its containers off the host and private ranges."""
        async with self._net_lock:
            if not self._net_ready:
                if self.here and not self.net.available:
                    raise errors.SandboxFailedError(f"Networked sandboxes are unavailable here: {self.net.why}")
                await asyncio.to_thread(self._make_network)
                self._net_ready = True
        return self.network

    def _make_network(self) -> None:
        found = self.client.networks.list(names=[self.network])
        if not any(n.name == self.network for n in found):
            ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(
                subnet=str(self.net.net), gateway=self.net.gateway)])
            self.client.networks.create(self.network, driver="bridge", ipam=ipam, labels={"orchard.service": self.tag},
                                        options={"com.docker.network.bridge.name": self.net.bridge,
                                                 "com.docker.network.bridge.enable_icc": "false"})
        if self.here:
            try:
                run_tool(["nft", "-f", "-"], self.net.ruleset())
            except errors.OrchardError as e:
                raise errors.SandboxFailedError(f"Network isolation could not be set up: {e.detail}") from e

    def _drop_network(self) -> None:
        try:
            self.client.networks.get(self.network).remove()
        except docker.errors.APIError:
            return                           # still in use (by containers left running): keep rules too
        if self.here:
            run_tool(["nft", "delete", "table", "inet", self.net.table], check=False)

    # ------------------------------------------------------------ delete
    async def delete(self, sandbox_id: str) -> None:
        self._deleting.add(sandbox_id)
        try:
            fwd = self._forwarders.pop(sandbox_id, None)
            if fwd is not None:
                await fwd.close()
            self._pids.unwatch(sandbox_id)
            self._boxes.pop(sandbox_id, None)
            await asyncio.to_thread(self._remove, self._container_name(sandbox_id))
        finally:
            self._deleting.discard(sandbox_id)

    def _remove(self, name: str) -> None:
        try:
            self.api.remove_container(name, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as e:
            if "removal of container" in _why(e) and "already in progress" in _why(e):
                return
            raise errors.BackendError(f"Removing container {name} failed: {_why(e)}") from e

    async def list_live(self) -> Optional[list[LiveSandbox]]:
        try:
            found = await asyncio.to_thread(self.api.containers, all=True,
                                            filters={"label": f"orchard.service={self.tag}"})
        except (docker.errors.DockerException, OSError):
            return None
        live = []
        for c in found:
            labels = c.get("Labels") or {}
            sid = labels.get("orchard.sandbox")
            if sid:
                live.append(LiveSandbox(sid, _float(labels.get("orchard.created"), c.get("Created")),
                                        alive=c.get("State") == "running"))
        return live

    # ------------------------------------------------------------ handles
    def _box(self, sandbox_id: str) -> Box:
        box = self._boxes.get(sandbox_id)
        if box is None:
            raise errors.SandboxNotFoundError(f"Sandbox {sandbox_id} is not running on this engine")
        return box

    async def _ready(self, sandbox_id: str) -> Box:
        """This replica's handle of a sandbox; one another replica created is attached on first use."""
        box = self._boxes.get(sandbox_id)
        if box is not None:
            return box
        return await self._attaching.run(sandbox_id, self._attach)     # concurrent first uses share one lookup

    async def _attach(self, sandbox_id: str) -> Box:
        """Handle of a running container of this service that this replica did not start (or lost track of)."""
        gone = errors.SandboxNotFoundError(f"Sandbox {sandbox_id} is not running on this engine")
        if sandbox_id in self._deleting:
            raise gone
        try:
            box = await asyncio.to_thread(self._inspect_box, sandbox_id, self._container_name(sandbox_id))
        except (docker.errors.NotFound, errors.SandboxFailedError) as e:
            raise gone from e
        except docker.errors.APIError as e:
            raise errors.BackendError(f"The container engine failed: {_why(e)}") from e
        except (docker.errors.DockerException, OSError) as e:
            raise errors.BackendError(f"The container engine cannot be reached: {e}") from e
        if sandbox_id in self._deleting:
            raise gone
        if sandbox_id not in self._boxes:
            self._track(box)
        return self._boxes[sandbox_id]

    def _forget(self, box: Box) -> None:
        """The engine no longer knows the container: drop the handle (a later use looks again)."""
        if self._boxes.get(box.sandbox_id) is box:
            self._pids.unwatch(box.sandbox_id)
            del self._boxes[box.sandbox_id]

    # ------------------------------------------------------------ exec
    def _argv(self, box: Box, argv: list[str]) -> list[str]:
        if argv[0] == "bash" and not box.has_bash:
            return ["sh"] + ["-l" if arg == "--login" else arg for arg in argv[1:]]
        return argv

    async def exec(self, sandbox_id: str, spec: ExecSpec) -> ExecOutcome:
        box = await self._ready(sandbox_id)
        env = {**box.env, **spec.env}
        argv = self._argv(box, spec.argv)
        if not box.fast:
            return await self._engine(box, container_api.run, replace(spec, argv=argv), spec.cwd or box.workdir, env)
        job = uuid.uuid4().hex[:12]
        try:
            return await run_helper(self._enter(box, spec.cwd, box.cgroups.job_flags(job), argv), env, spec,
                                    kill_tree=lambda: asyncio.to_thread(box.cgroups.kill_job, job))
        finally:
            asyncio.get_running_loop().run_in_executor(None, box.cgroups.remove_job, job)

    async def _engine(self, box: Box, call, *args):
        """An engine-API path call in a thread, its failures as Orchard errors."""
        try:
            return await asyncio.to_thread(call, self.api, box.container_id, *args)
        except docker.errors.NotFound as e:
            self._forget(box)
            raise errors.SandboxNotFoundError(f"Sandbox {box.sandbox_id} is gone: {_why(e)}") from e
        except docker.errors.APIError as e:
            if e.status_code == 409:
                raise errors.SandboxNotFoundError(f"Sandbox {box.sandbox_id} is not running: {_why(e)}") from e
            raise errors.BackendError(f"The container engine failed: {_why(e)}") from e
        except (docker.errors.DockerException, OSError) as e:
            raise errors.BackendError(f"The container engine cannot be reached: {e}") from e

    def _enter(self, box: Box, cwd: Optional[str], flags: list[str], argv: list[str]) -> list[str]:
        return [self.helper, "enter", str(box.pid), cwd or box.workdir, *flags, "--", *argv]

    async def open_pty(self, sandbox_id: str, argv: list[str], cwd: Optional[str], env: dict[str, str],
                       rows: int, cols: int) -> PtyProcess:
        box = await self._ready(sandbox_id)
        argv, env = self._argv(box, argv), {**box.env, **env}
        if not box.fast:
            return await self._engine(box, container_api.ApiPty, argv, cwd or box.workdir, env, rows, cols)
        job = uuid.uuid4().hex[:12]

        async def end() -> None:
            await asyncio.to_thread(box.cgroups.kill_job, job)
            await asyncio.to_thread(box.cgroups.remove_job, job)

        return await PtyHandle.start(self._enter(box, cwd, box.cgroups.job_flags(job), argv), env, rows, cols, end)

    # ------------------------------------------------------------ files
    async def read_file(self, sandbox_id: str, path: str, limit: int) -> bytes:
        box = await self._ready(sandbox_id)
        if not box.fast:
            return await self._engine(box, container_api.read_file, path, limit)
        code, out, err, status = await self._file_op(box, ["get", path, str(limit)], None, limit)
        if code == 0 and len(out) <= limit:
            return out
        raise _file_error(code, err, status, path, limit)

    async def write_file(self, sandbox_id: str, path: str, data: bytes, mode: Optional[int]) -> None:
        box = await self._ready(sandbox_id)
        if not box.fast:
            return await self._engine(box, container_api.write_file, path, data, mode)
        code, _, err, status = await self._file_op(box, ["put", path, str(-1 if mode is None else mode)], data, 0)
        if code != 0:
            raise _file_error(code, err, status, path, len(data))

    async def _file_op(self, box: Box, args: list[str], data: Optional[bytes], limit: int):
        """Files move through the helper run *inside* the container: its view, its user, its cgroups."""
        argv = self._enter(box, "/", box.cgroups.join_flags(), [f"/proc/self/fd/{self._helper_fd}", *args])
        return await run_file_op(argv, box.env, data, limit, self._helper_fd)

    async def list_dir(self, sandbox_id: str, path: str) -> list[FileEntry]:
        box = await self._ready(sandbox_id)
        if not box.fast:
            return await self._engine(box, container_api.list_dir, path)
        return await asyncio.to_thread(SandboxFS(f"/proc/{box.pid}/root").list, path)

    # ------------------------------------------------------------ snapshot
    async def snapshot(self, sandbox_id: str, image: str) -> int:
        box = await self._ready(sandbox_id)
        return await asyncio.to_thread(self._commit, box, image)

    def _commit(self, box: Box, name: str) -> int:
        ref = snapshot_reference(name, self.tag)
        repository, tag = ref.rsplit(":", 1)
        try:
            old = self.api.inspect_image(ref)["Id"] if self._has_image(ref) else None
            base = self.api.inspect_container(box.container_id)["Image"]
            new = self.api.commit(box.container_id, repository=repository, tag=tag, pause=True)
            sizes = [self.api.inspect_image(i).get("Size") or 0 for i in (base, new["Id"])]
        except docker.errors.APIError as e:
            raise errors.BackendError(f"Snapshot of {box.sandbox_id} failed: {_why(e)}") from e
        if old and old != new["Id"]:
            self._forget_image(old)
        return max(0, sizes[1] - sizes[0])

    def _forget_image(self, image_id: str) -> None:
        """A replaced snapshot lost its name: free it unless a container still runs from it."""
        try:
            self.api.remove_image(image_id)
        except docker.errors.APIError as e:
            log.info("replaced snapshot image %s kept: %s", image_id[:19], _why(e)[-200:])

    # ------------------------------------------------------------ facts
    async def workdir(self, sandbox_id: str) -> str:
        try:
            return (await self._ready(sandbox_id)).workdir
        except errors.OrchardError:
            return DEFAULT_WORKDIR

    def images(self) -> list[str]:
        try:
            listed = self.api.images()
        except (docker.errors.DockerException, OSError):
            return ["host"]
        tags = {t for image in listed for t in image.get("RepoTags") or [] if "<none>" not in t}
        hidden = (SNAPSHOT_REPOSITORY + "/", HOST_REPOSITORY + ":")
        return ["host", *sorted(t for t in tags if not t.startswith(hidden))]

    def capacity(self) -> tuple[float, int]:
        return self._capacity

    def memory_used(self, sandbox_id: str) -> Optional[int]:
        box = self._boxes.get(sandbox_id)
        return box.cgroups.memory_used() if box is not None and box.fast else None

    def inventory(self) -> dict[str, set[str]]:
        """Every container of this service by sandbox id (for leak checks)."""
        found: dict[str, set[str]] = {}
        for c in self.api.containers(all=True, filters={"label": f"orchard.service={self.tag}"}):
            found.setdefault((c.get("Labels") or {}).get("orchard.sandbox", "?"), set()).add("container")
        return found


# ---------------------------------------------------------------- helpers
def service_tag(settings: Settings) -> str:
    """Who owns a container: replicas sharing a Redis store are one service; otherwise the state dir is."""
    owner = f"redis:{settings.redis_url}" if settings.store == "redis" else str(Path(settings.state_dir).resolve())
    return hashlib.sha256(owner.encode()).hexdigest()[:8]


def _engine_here(url: str, info: dict) -> bool:
    """The engine answers on a local unix socket and reports this machine's hostname."""
    parsed = urlparse(url)
    if parsed.scheme not in ("unix", "http+unix") or not os.path.exists(parsed.path or url[len("unix://"):]):
        return False
    return info.get("Name") == os.uname().nodename


def _split_reference(name: str) -> tuple[str, Optional[str]]:
    """'repo[:tag][@digest]' -> (repo, tag or digest); a ':' inside the registry host is not a tag."""
    if "@" in name:
        repo, digest = name.split("@", 1)
        return repo, digest
    repo, _, tag = name.rpartition(":")
    if not repo or "/" in tag:
        return name, "latest"
    return repo, tag


def _why(e: Exception) -> str:
    explanation = getattr(e, "explanation", None)
    return str(explanation or e).strip()[-500:]


def _float(*values) -> float:
    for value in values:
        try:
            return float(value)
        except (TypeError, ValueError):
            continue
    return 0.0
