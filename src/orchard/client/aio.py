"""The asyncio SDK: ``AsyncSandboxClient`` and its sandbox handles drive the shared flows over ``httpx.AsyncClient``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from pathlib import Path
from typing import Any, Optional, Union

import httpx

from orchard import errors
from orchard.client.base import ClientConfig, ClientCore, Flow, HttpReply, HttpRequest, Sleep, request_timeout
from orchard.client.pty import AsyncPtyProcess
from orchard.client.results import JobResult
from orchard.client.sync import EMERGENCY_TIMEOUT, emergency_delete, register, unregister
from orchard.env import protocol as p

log = logging.getLogger("orchard.client")


def _remember_missing_sniffio() -> None:
    """httpcore tries `import sniffio` on every async request; when it is absent each try rescans sys.path.

    Recording the miss once (a None entry makes later imports fail at once) removes that cost.
    """
    import importlib.util
    import sys

    if "sniffio" not in sys.modules and importlib.util.find_spec("sniffio") is None:
        sys.modules["sniffio"] = None  # type: ignore[assignment]


_remember_missing_sniffio()


# ---------------------------------------------------------------- the asyncio driver
async def drive(flow: Flow[Any], http: httpx.AsyncClient, default_timeout: Optional[float]) -> Any:
    """Run a flow to its end: send each HttpRequest over ``http`` and sleep on each Sleep."""
    value: Any = None
    failure: Optional[BaseException] = None
    while True:
        try:
            step = flow.throw(failure) if failure is not None else flow.send(value)
        except StopIteration as stop:
            return stop.value
        value, failure = await _step(step, http, default_timeout)


async def _step(step: Any, http: httpx.AsyncClient,
                default_timeout: Optional[float]) -> tuple[Any, Optional[BaseException]]:
    """Carry out one step of a flow: sleep, or send and catch the transport error for the flow."""
    if isinstance(step, Sleep):
        await asyncio.sleep(step.seconds)
        return None, None
    try:
        return await _send(step, http, default_timeout), None
    except httpx.TransportError as exc:
        return None, exc


async def _send(request: HttpRequest, http: httpx.AsyncClient, default_timeout: Optional[float]) -> HttpReply:
    """Send one request and return the reply as data."""
    response = await http.request(request.method, request.path, json=request.json, params=request.params,
                                  headers=request.headers, timeout=request_timeout(request, default_timeout))
    return HttpReply.from_raw(response.status_code, response.headers, response.content)


# ---------------------------------------------------------------- client
class AsyncSandboxClient:
    """Asyncio client of an Orchard Env service; an async context manager that cleans up what it created."""

    def __init__(self, base_url: Optional[str] = None, timeout: Optional[float] = 1200,
                 auto_cleanup: bool = True, api_key: Optional[str] = None, prefix: Optional[str] = None,
                 *, transport: Optional[httpx.AsyncBaseTransport] = None):
        self._core = ClientCore(ClientConfig.resolve(base_url, timeout, auto_cleanup, api_key, prefix))
        self._http = httpx.AsyncClient(base_url=self.config.base_url, headers=self._core.default_headers(),
                                       timeout=self.config.timeout, transport=transport)
        self._closed = False
        if auto_cleanup:
            register(self)

    async def _run(self, flow: Flow[Any]) -> Any:
        """Drive a flow over this client's connection pool."""
        if self._closed:
            raise RuntimeError("this AsyncSandboxClient is closed")
        return await drive(flow, self._http, self.config.timeout)

    @property
    def config(self) -> ClientConfig:
        """The resolved settings (base URL, key, prefix, timeout, auto_cleanup)."""
        return self._core.config

    @property
    def base_url(self) -> str:
        """The service URL in use."""
        return self.config.base_url

    @property
    def closed(self) -> bool:
        """True after ``close()``."""
        return self._closed

    def tracked_sandboxes(self) -> list[str]:
        """Ids of sandboxes this client created and has not deleted."""
        return self._core.tracked()

    # -- service
    async def health(self) -> p.Health:
        """GET /health."""
        return await self._run(self._core.health_flow())

    async def resources(self) -> p.ResourcesResponse:
        """The service's capacity summary."""
        return await self._run(self._core.resources_flow())

    async def list_sandboxes(self, status: Optional[str] = None) -> list[p.SandboxInfo]:
        """The caller's sandboxes, optionally only those in ``status``."""
        return await self._run(self._core.list_flow(status))

    # -- sandboxes
    async def create_sandbox(self, image: str, block_network: bool = True, sandbox_id: Optional[str] = None,
                             cpu: Optional[str] = None, memory: Optional[str] = None, timeout: Optional[float] = 3600,
                             wait_ready: bool = True, poll_interval: float = 1.0,
                             **extra: Any) -> "AsyncSandboxInstance":
        """Create a sandbox (extra keys such as ttl_seconds go into the body) and wait until it is ready."""
        body = self._core.create_body(image, block_network, sandbox_id, cpu, memory, timeout, extra)
        created = await self._run(self._core.create_flow(body, wait_ready, timeout, poll_interval))
        return AsyncSandboxInstance(self, created.sandbox_id)

    async def get_sandbox(self, sandbox_id: str) -> "AsyncSandboxInstance":
        """A handle on an existing sandbox; SandboxNotFoundError if there is none."""
        await self._run(self._core.info_flow(sandbox_id))
        return AsyncSandboxInstance(self, sandbox_id)

    async def delete_sandbox(self, sandbox_id: str) -> p.DeleteResponse:
        """Delete a sandbox; deleting an unknown or already deleted one is not an error."""
        return await self._run(self._core.delete_flow(sandbox_id))

    async def cleanup_all(self) -> list[str]:
        """Delete every sandbox this client created; return the ids deleted (failures are logged and kept)."""
        ids = self._core.tracked()
        done = await asyncio.gather(*(self._delete_quietly(sandbox_id) for sandbox_id in ids))
        return [sandbox_id for sandbox_id, ok in zip(ids, done) if ok]

    async def _delete_quietly(self, sandbox_id: str) -> bool:
        """Delete one sandbox; log and return False if that fails."""
        try:
            await self.delete_sandbox(sandbox_id)
            return True
        except (errors.OrchardError, httpx.HTTPError) as exc:
            log.warning("orchard: could not delete sandbox %s: %s", sandbox_id, exc)
            return False

    # -- lifetime
    async def close(self) -> None:
        """Delete tracked sandboxes (with auto_cleanup) and close the connection pool."""
        if self._closed:
            return
        try:
            if self.config.auto_cleanup:
                await self.cleanup_all()
        finally:
            self._closed = True
            unregister(self)
            await self._http.aclose()

    def _emergency_cleanup(self) -> None:
        """Exit-time cleanup over a fresh blocking connection (no event loop is needed or started)."""
        if self._closed or not self.config.auto_cleanup or not self._core.tracked():
            return
        with httpx.Client(base_url=self.config.base_url, headers=self._core.default_headers(),
                          timeout=EMERGENCY_TIMEOUT) as http:
            emergency_delete(self._core, http)

    async def __aenter__(self) -> "AsyncSandboxClient":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncSandboxClient(base_url={self.base_url!r})"


# ---------------------------------------------------------------- sandbox handle
class AsyncSandboxInstance:
    """A handle on one sandbox; leaving its ``async with`` block deletes the sandbox."""

    def __init__(self, client: AsyncSandboxClient, sandbox_id: str):
        self.client = client
        self.sandbox_id = sandbox_id
        self._heartbeat: Optional[asyncio.Task] = None

    async def _run(self, flow: Flow[Any]) -> Any:
        """Drive a flow through the owning client."""
        return await self.client._run(flow)

    @property
    def _core(self) -> ClientCore:
        """The owning client's I/O-free core."""
        return self.client._core

    async def exec(self, command: Union[str, list[str]], timeout: Optional[float] = None,
                   cwd: Optional[str] = None, env: Optional[dict[str, str]] = None, login_shell: bool = False,
                   pty: bool = False) -> Union[JobResult, AsyncPtyProcess]:
        """Run a command (a string under bash, a list as argv): its JobResult, or an AsyncPtyProcess if pty."""
        if pty:
            init = self._core.pty_init(command, cwd, env, login_shell)
            return await AsyncPtyProcess.open(self._core.pty_url(self.sandbox_id), self._core.pty_subprotocols(),
                                              init)
        return await self._run(self._core.exec_flow(self.sandbox_id, command, timeout, cwd, env, login_shell))

    async def get_job(self, job_id: str) -> JobResult:
        """The current state of a job."""
        return await self._run(self._core.job_flow(job_id))

    async def apply_patch(self, patch: str, timeout: float = 30,
                          cwd: Optional[str] = None) -> p.ApplyPatchResponse:
        """Apply a unified diff with git apply (in ``cwd``, default the sandbox workdir)."""
        return await self._run(self._core.apply_patch_flow(self.sandbox_id, patch, timeout, cwd))

    async def upload_content(self, content: Union[bytes, str], remote_path: str) -> p.UploadResponse:
        """Write bytes (or UTF-8 text) to ``remote_path``; parent directories are created."""
        return await self._run(self._core.upload_flow(self.sandbox_id, content, remote_path))

    async def upload_file(self, local_path: Union[str, os.PathLike], remote_path: str) -> p.UploadResponse:
        """Copy a local file into the sandbox, keeping its permission bits (the read happens off the loop)."""
        data, mode = await asyncio.to_thread(_read_local, Path(local_path))
        return await self._run(self._core.upload_flow(self.sandbox_id, data, remote_path, mode))

    async def download_content(self, remote_path: str) -> bytes:
        """The bytes of a file in the sandbox."""
        return await self._run(self._core.download_flow(self.sandbox_id, remote_path))

    async def download_file(self, remote_path: str, local_path: Union[str, os.PathLike]) -> Path:
        """Copy a file out of the sandbox to ``local_path`` (parents created); return the local path."""
        data = await self.download_content(remote_path)
        return await asyncio.to_thread(_write_local, Path(local_path), data)

    async def list_files(self, remote_path: str) -> list[p.FileEntry]:
        """The entries of a directory in the sandbox, sorted by name."""
        return await self._run(self._core.list_files_flow(self.sandbox_id, remote_path))

    async def info(self) -> p.SandboxInfo:
        """The sandbox's current info."""
        return await self._run(self._core.info_flow(self.sandbox_id))

    async def wait_ready(self, timeout: Optional[float] = 3600, poll_interval: float = 1.0) -> p.SandboxInfo:
        """Wait until the sandbox is ready; SandboxFailedError or SandboxTimeoutError otherwise."""
        return await self._run(self._core.wait_flow(self.sandbox_id, timeout, poll_interval))

    async def snapshot(self, image: str) -> p.SnapshotResponse:
        """Save the sandbox's filesystem as a new image that later sandboxes can start from."""
        return await self._run(self._core.snapshot_flow(self.sandbox_id, image))

    async def heartbeat(self) -> p.HeartbeatResponse:
        """Send one heartbeat now."""
        return await self._run(self._core.heartbeat_flow(self.sandbox_id))

    async def start_heartbeat(self, interval: float = 60) -> None:
        """Send a heartbeat now and every ``interval`` seconds from a background task."""
        await self.stop_heartbeat()
        self._heartbeat = asyncio.get_running_loop().create_task(
            self._beat(interval), name=f"orchard-heartbeat-{self.sandbox_id}")

    async def stop_heartbeat(self) -> None:
        """Stop the background heartbeat, if one runs."""
        task, self._heartbeat = self._heartbeat, None
        if task is None or task is asyncio.current_task():
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _beat(self, interval: float) -> None:
        """Beat until stopped, the client closes or the sandbox is gone."""
        while not self.client.closed and await _beat_once(self):
            await asyncio.sleep(interval)

    async def delete(self) -> p.DeleteResponse:
        """Delete the sandbox (idempotent) and stop its heartbeat."""
        await self.stop_heartbeat()
        return await self.client.delete_sandbox(self.sandbox_id)

    async def __aenter__(self) -> "AsyncSandboxInstance":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.delete()

    def __repr__(self) -> str:
        return f"AsyncSandboxInstance(sandbox_id={self.sandbox_id!r})"


async def _beat_once(sandbox: AsyncSandboxInstance) -> bool:
    """Send one heartbeat; False when the sandbox is gone or the client closed (stop beating)."""
    try:
        await sandbox.heartbeat()
    except (errors.SandboxNotFoundError, RuntimeError):
        return False
    except (errors.OrchardError, httpx.HTTPError) as exc:
        log.warning("orchard: heartbeat for %s failed: %s", sandbox.sandbox_id, exc)
    return True


def _read_local(path: Path) -> tuple[bytes, int]:
    """Read a local file and its permission bits (runs in a worker thread)."""
    return path.read_bytes(), stat.S_IMODE(path.stat().st_mode)


def _write_local(path: Path, data: bytes) -> Path:
    """Write a local file, creating its parents (runs in a worker thread)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path
