"""The blocking SDK: ``SandboxClient`` and ``SandboxInstance`` drive the shared flows over ``httpx.Client``.

This module also holds the exit-time cleanup registry that both clients use: at
interpreter exit and on SIGINT/SIGTERM, every live client with ``auto_cleanup``
deletes the sandboxes it created, over a fresh blocking connection.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import stat
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Optional, Union

import httpx

from orchard import errors
from orchard.client.base import ClientConfig, ClientCore, Flow, HttpReply, HttpRequest, Sleep, request_timeout
from orchard.client.pty import PtyProcess
from orchard.client.results import JobResult
from orchard.env import protocol as p

log = logging.getLogger("orchard.client")
EMERGENCY_TIMEOUT = 10.0


# ---------------------------------------------------------------- the blocking driver
def drive(flow: Flow[Any], http: httpx.Client, default_timeout: Optional[float]) -> Any:
    """Run a flow to its end: send each HttpRequest over ``http`` and sleep on each Sleep."""
    value: Any = None
    failure: Optional[BaseException] = None
    while True:
        try:
            step = flow.throw(failure) if failure is not None else flow.send(value)
        except StopIteration as stop:
            return stop.value
        value, failure = _step(step, http, default_timeout)


def _step(step: Any, http: httpx.Client, default_timeout: Optional[float]) -> tuple[Any, Optional[BaseException]]:
    """Carry out one step of a flow: sleep, or send and catch the transport error for the flow."""
    if isinstance(step, Sleep):
        time.sleep(step.seconds)
        return None, None
    try:
        return _send(step, http, default_timeout), None
    except httpx.TransportError as exc:
        return None, exc


def _send(request: HttpRequest, http: httpx.Client, default_timeout: Optional[float]) -> HttpReply:
    """Send one request and return the reply as data."""
    response = http.request(request.method, request.path, json=request.json, params=request.params,
                            headers=request.headers, timeout=request_timeout(request, default_timeout))
    return HttpReply.from_raw(response.status_code, response.headers, response.content)


# ---------------------------------------------------------------- exit-time cleanup
_LIVE: "weakref.WeakSet[Any]" = weakref.WeakSet()
_HOOKS = {"atexit": False, "signals": False}
_HOOK_LOCK = threading.Lock()


def register(client: Any) -> None:
    """Remember a live client so its sandboxes go at exit or on SIGINT/SIGTERM (weakly: no leak)."""
    _install_hooks()
    _LIVE.add(client)


def unregister(client: Any) -> None:
    """Forget a closed client, so it is never cleaned twice."""
    _LIVE.discard(client)


def cleanup_live_clients() -> None:
    """Delete the tracked sandboxes of every live client (best effort, never raises)."""
    for client in list(_LIVE):
        try:
            client._emergency_cleanup()
        except Exception as exc:  # at exit nothing can be done but say so
            log.warning("orchard: cleanup at exit failed: %s", exc)


def emergency_delete(core: ClientCore, http: httpx.Client) -> None:
    """One DELETE per tracked sandbox; stop as soon as the service is unreachable."""
    for sandbox_id in core.tracked():
        try:
            drive(core.delete_flow(sandbox_id, attempts=1), http, EMERGENCY_TIMEOUT)
        except errors.ServiceUnreachableError as exc:
            log.warning("orchard: service unreachable, sandboxes left behind: %s", exc)
            return
        except errors.OrchardError as exc:
            log.warning("orchard: could not delete sandbox %s: %s", sandbox_id, exc)


def _install_hooks() -> None:
    """Register the atexit hook once, and the signal hooks once from the main thread."""
    with _HOOK_LOCK:
        if not _HOOKS["atexit"]:
            atexit.register(cleanup_live_clients)
            _HOOKS["atexit"] = True
        if not _HOOKS["signals"] and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                _chain_signal(signum)
            _HOOKS["signals"] = True


def _chain_signal(signum: int) -> None:
    """Put our cleanup in front of whatever handled ``signum`` before (an ignored signal stays ignored)."""
    previous = signal.getsignal(signum)
    if previous in (signal.SIG_IGN, None):
        return

    def handler(sig: int, frame: Any) -> None:
        cleanup_live_clients()
        _forward(previous, sig, frame)

    signal.signal(signum, handler)


def _forward(previous: Any, signum: int, frame: Any) -> None:
    """Hand the signal to the handler we replaced, or re-deliver it with the default action."""
    if callable(previous):
        previous(signum, frame)
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


# ---------------------------------------------------------------- client
class SandboxClient:
    """Blocking client of an Orchard Env service; a context manager that cleans up what it created."""

    def __init__(self, base_url: Optional[str] = None, timeout: Optional[float] = 1200,
                 auto_cleanup: bool = True, api_key: Optional[str] = None, prefix: Optional[str] = None,
                 *, transport: Optional[httpx.BaseTransport] = None):
        self._core = ClientCore(ClientConfig.resolve(base_url, timeout, auto_cleanup, api_key, prefix))
        self._transport = transport
        self._http = self._new_http(transport, self.config.timeout)
        self._closed = False
        if auto_cleanup:
            register(self)

    def _new_http(self, transport: Optional[httpx.BaseTransport], timeout: Optional[float]) -> httpx.Client:
        """A connection pool to the service with the SDK's headers."""
        return httpx.Client(base_url=self.config.base_url, headers=self._core.default_headers(),
                            timeout=timeout, transport=transport)

    def _run(self, flow: Flow[Any]) -> Any:
        """Drive a flow over this client's connection pool."""
        if self._closed:
            raise RuntimeError("this SandboxClient is closed")
        return drive(flow, self._http, self.config.timeout)

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
    def health(self) -> p.Health:
        """GET /health."""
        return self._run(self._core.health_flow())

    def resources(self) -> p.ResourcesResponse:
        """The service's capacity summary."""
        return self._run(self._core.resources_flow())

    def list_sandboxes(self, status: Optional[str] = None) -> list[p.SandboxInfo]:
        """The caller's sandboxes, optionally only those in ``status``."""
        return self._run(self._core.list_flow(status))

    # -- sandboxes
    def create_sandbox(self, image: str, block_network: bool = True, sandbox_id: Optional[str] = None,
                       cpu: Optional[str] = None, memory: Optional[str] = None, timeout: Optional[float] = 3600,
                       wait_ready: bool = True, poll_interval: float = 1.0, **extra: Any) -> "SandboxInstance":
        """Create a sandbox (extra keys such as ttl_seconds go into the body) and wait until it is ready."""
        body = self._core.create_body(image, block_network, sandbox_id, cpu, memory, timeout, extra)
        created = self._run(self._core.create_flow(body, wait_ready, timeout, poll_interval))
        return SandboxInstance(self, created.sandbox_id)

    def get_sandbox(self, sandbox_id: str) -> "SandboxInstance":
        """A handle on an existing sandbox; SandboxNotFoundError if there is none."""
        self._run(self._core.info_flow(sandbox_id))
        return SandboxInstance(self, sandbox_id)

    def delete_sandbox(self, sandbox_id: str) -> p.DeleteResponse:
        """Delete a sandbox; deleting an unknown or already deleted one is not an error."""
        return self._run(self._core.delete_flow(sandbox_id))

    def cleanup_all(self) -> list[str]:
        """Delete every sandbox this client created; return the ids deleted (failures are logged and kept)."""
        deleted = []
        for sandbox_id in self._core.tracked():
            try:
                self.delete_sandbox(sandbox_id)
                deleted.append(sandbox_id)
            except (errors.OrchardError, httpx.HTTPError) as exc:
                log.warning("orchard: could not delete sandbox %s: %s", sandbox_id, exc)
        return deleted

    # -- lifetime
    def close(self) -> None:
        """Delete tracked sandboxes (with auto_cleanup) and close the connection pool."""
        if self._closed:
            return
        try:
            if self.config.auto_cleanup:
                self.cleanup_all()
        finally:
            self._closed = True
            unregister(self)
            self._http.close()

    def _emergency_cleanup(self) -> None:
        """Exit-time cleanup over a fresh connection, safe even if a request was interrupted mid-flight."""
        if self._closed or not self.config.auto_cleanup or not self._core.tracked():
            return
        with self._new_http(self._transport, EMERGENCY_TIMEOUT) as http:
            emergency_delete(self._core, http)

    def __enter__(self) -> "SandboxClient":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SandboxClient(base_url={self.base_url!r})"


# ---------------------------------------------------------------- sandbox handle
class SandboxInstance:
    """A handle on one sandbox; leaving its ``with`` block deletes the sandbox."""

    def __init__(self, client: SandboxClient, sandbox_id: str):
        self.client = client
        self.sandbox_id = sandbox_id
        self._heartbeat: Optional[tuple[threading.Thread, threading.Event]] = None

    def _run(self, flow: Flow[Any]) -> Any:
        """Drive a flow through the owning client."""
        return self.client._run(flow)

    @property
    def _core(self) -> ClientCore:
        """The owning client's I/O-free core."""
        return self.client._core

    def exec(self, command: Union[str, list[str]], timeout: Optional[float] = None, cwd: Optional[str] = None,
             env: Optional[dict[str, str]] = None, login_shell: bool = False,
             pty: bool = False) -> Union[JobResult, PtyProcess]:
        """Run a command (a string under bash, a list as argv): its JobResult, or a PtyProcess (no timeout) if pty."""
        if pty:
            init = self._core.pty_init(command, cwd, env, login_shell)
            return PtyProcess.open(self._core.pty_url(self.sandbox_id), self._core.pty_subprotocols(), init)
        return self._run(self._core.exec_flow(self.sandbox_id, command, timeout, cwd, env, login_shell))

    def get_job(self, job_id: str) -> JobResult:
        """The current state of a job."""
        return self._run(self._core.job_flow(job_id))

    def apply_patch(self, patch: str, timeout: float = 30, cwd: Optional[str] = None) -> p.ApplyPatchResponse:
        """Apply a unified diff with git apply (in ``cwd``, default the sandbox workdir)."""
        return self._run(self._core.apply_patch_flow(self.sandbox_id, patch, timeout, cwd))

    def upload_content(self, content: Union[bytes, str], remote_path: str) -> p.UploadResponse:
        """Write bytes (or UTF-8 text) to ``remote_path``; parent directories are created."""
        return self._run(self._core.upload_flow(self.sandbox_id, content, remote_path))

    def upload_file(self, local_path: Union[str, os.PathLike], remote_path: str) -> p.UploadResponse:
        """Copy a local file into the sandbox, keeping its permission bits."""
        path = Path(local_path)
        mode = stat.S_IMODE(path.stat().st_mode)
        return self._run(self._core.upload_flow(self.sandbox_id, path.read_bytes(), remote_path, mode))

    def download_content(self, remote_path: str) -> bytes:
        """The bytes of a file in the sandbox."""
        return self._run(self._core.download_flow(self.sandbox_id, remote_path))

    def download_file(self, remote_path: str, local_path: Union[str, os.PathLike]) -> Path:
        """Copy a file out of the sandbox to ``local_path`` (parents created); return the local path."""
        target = Path(local_path)
        data = self.download_content(remote_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        return target

    def list_files(self, remote_path: str) -> list[p.FileEntry]:
        """The entries of a directory in the sandbox, sorted by name."""
        return self._run(self._core.list_files_flow(self.sandbox_id, remote_path))

    def info(self) -> p.SandboxInfo:
        """The sandbox's current info."""
        return self._run(self._core.info_flow(self.sandbox_id))

    def wait_ready(self, timeout: Optional[float] = 3600, poll_interval: float = 1.0) -> p.SandboxInfo:
        """Block until the sandbox is ready; SandboxFailedError or SandboxTimeoutError otherwise."""
        return self._run(self._core.wait_flow(self.sandbox_id, timeout, poll_interval))

    def snapshot(self, image: str) -> p.SnapshotResponse:
        """Save the sandbox's filesystem as a new image that later sandboxes can start from."""
        return self._run(self._core.snapshot_flow(self.sandbox_id, image))

    def heartbeat(self) -> p.HeartbeatResponse:
        """Send one heartbeat now."""
        return self._run(self._core.heartbeat_flow(self.sandbox_id))

    def start_heartbeat(self, interval: float = 60) -> None:
        """Send a heartbeat now and every ``interval`` seconds from a daemon thread."""
        self.stop_heartbeat()
        stop = threading.Event()
        thread = threading.Thread(target=self._beat, args=(interval, stop), daemon=True,
                                  name=f"orchard-heartbeat-{self.sandbox_id}")
        self._heartbeat = (thread, stop)
        thread.start()

    def stop_heartbeat(self) -> None:
        """Stop the background heartbeat, if one runs."""
        if self._heartbeat is None:
            return
        thread, stop = self._heartbeat
        self._heartbeat = None
        stop.set()
        if thread is not threading.current_thread():
            thread.join(timeout=1.0)

    def _beat(self, interval: float, stop: threading.Event) -> None:
        """Beat until stopped, the client closes or the sandbox is gone."""
        while not stop.is_set() and not self.client.closed:
            if not _beat_once(self):
                return
            stop.wait(interval)

    def delete(self) -> p.DeleteResponse:
        """Delete the sandbox (idempotent) and stop its heartbeat."""
        self.stop_heartbeat()
        return self.client.delete_sandbox(self.sandbox_id)

    def __enter__(self) -> "SandboxInstance":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.delete()

    def __repr__(self) -> str:
        return f"SandboxInstance(sandbox_id={self.sandbox_id!r})"


def _beat_once(sandbox: SandboxInstance) -> bool:
    """Send one heartbeat; False when the sandbox is gone or the client closed (stop beating)."""
    try:
        sandbox.heartbeat()
    except (errors.SandboxNotFoundError, RuntimeError):
        return False
    except (errors.OrchardError, httpx.HTTPError) as exc:
        log.warning("orchard: heartbeat for %s failed: %s", sandbox.sandbox_id, exc)
    return True
