"""The I/O-free half of the SDK: each call is a generator of HTTP steps that the sync and async clients drive.

A *flow* yields ``HttpRequest`` (the driver sends it and sends back an ``HttpReply``, or
throws the transport error into the flow) and ``Sleep`` (the driver sleeps). Retries,
waits and reply parsing all live here, so ``SandboxClient`` and ``AsyncSandboxClient``
differ only in the lines that send and sleep.
"""

from __future__ import annotations

import base64
import email.utils
import itertools
import json
import math
import os
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any, Generator, Mapping, Optional, TypeVar, Union
from urllib.parse import quote
from uuid import uuid4

import httpx
from pydantic import BaseModel, ValidationError

from orchard import errors
from orchard.env import protocol as p
from orchard.client.results import JobResult

SDK_VERSION = "0.1.0"

DEFAULT_BASE_URL = "http://127.0.0.1:8080"
WAIT_CHUNK = 60          # longest single server-side wait we ask for, in seconds
READ_MARGIN = 30         # the HTTP read timeout exceeds a server-side wait by this much
EXEC_GRACE = 30.0        # exec gives up this long after its own timeout
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


# ---------------------------------------------------------------- config
@dataclass(frozen=True)
class ClientConfig:
    """Where the service is and how to talk to it, after constructor > environment > default."""

    base_url: str
    api_key: Optional[str]
    prefix: Optional[str]
    timeout: Optional[float]
    auto_cleanup: bool = True

    @classmethod
    def resolve(cls, base_url=None, timeout=1200, auto_cleanup=True, api_key=None, prefix=None,
                environ: Optional[Mapping[str, str]] = None) -> "ClientConfig":
        """Resolve each setting: an explicit argument wins over SANDBOX_* variables, which win over defaults."""
        env = os.environ if environ is None else environ
        url = _pick(base_url, env.get("SANDBOX_BASE_URL"), DEFAULT_BASE_URL).rstrip("/")
        key = _pick(api_key, env.get("SANDBOX_API_KEY"), None)
        pre = _check_prefix(_pick(prefix, env.get("SANDBOX_PREFIX"), None))
        return cls(url, key, pre, None if timeout is None else float(timeout), auto_cleanup)


def _pick(given, from_env, default):
    """The given value if any, else the environment's (when non-empty), else the default."""
    if given is not None:
        return given
    return from_env or default


def _check_prefix(prefix: Optional[str]) -> Optional[str]:
    """Lowercase a sandbox-id prefix and make sure ids built from it stay DNS labels."""
    if not prefix:
        return None
    prefix = prefix.lower()
    if not re.match(p.SANDBOX_ID_PATTERN, f"{prefix}-{'0' * 12}"):
        raise ValueError(f"SANDBOX_PREFIX {prefix!r} cannot start a DNS label (a-z, 0-9, '-', at most 50 chars)")
    return prefix


# ---------------------------------------------------------------- steps
@dataclass
class HttpRequest:
    """One HTTP call as data; ``idempotent`` says a resend is safe after the server may have seen it."""

    method: str
    path: str
    json: Any = None
    params: Optional[dict[str, Any]] = None
    headers: dict[str, str] = field(default_factory=dict)
    idempotent: Optional[bool] = None
    read_timeout: Optional[float] = None
    not_found: type[errors.OrchardError] = errors.NotFoundError
    attempts: Optional[int] = None

    def __post_init__(self) -> None:
        if self.idempotent is None:
            self.idempotent = self.method in ("GET", "DELETE", "HEAD")


@dataclass
class HttpReply:
    """A reply as data: status, headers and the JSON body (or text when it is not JSON)."""

    status: int
    headers: Mapping[str, str]
    body: Any

    @classmethod
    def from_raw(cls, status: int, headers: Mapping[str, str], content: bytes) -> "HttpReply":
        """Decode a raw reply body as JSON, keeping text when it is not JSON."""
        try:
            body = json.loads(content) if content else None
        except ValueError:
            body = content.decode("utf-8", "replace")
        return cls(status, headers, body)

    @property
    def ok(self) -> bool:
        """True for a 2xx status."""
        return 200 <= self.status < 300

    @property
    def retry_after(self) -> Optional[float]:
        """The Retry-After header in seconds (number or HTTP date), or None."""
        return parse_retry_after(self.headers.get("retry-after"))


@dataclass(frozen=True)
class Sleep:
    """Ask the driver to pause before the flow goes on."""

    seconds: float


Step = Union[HttpRequest, Sleep]
Flow = Generator[Step, Any, T]


def parse_retry_after(value: Optional[str]) -> Optional[float]:
    """Read a Retry-After value given as seconds or as an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


# ---------------------------------------------------------------- retry policy
@dataclass
class RetryPolicy:
    """3 attempts; backoff 1 s, 2 s, 4 s plus jitter; a 503's Retry-After wins over the backoff."""

    attempts: int = 3
    backoff_base: float = 1.0
    max_delay: float = 60.0

    def backoff(self, attempt: int) -> float:
        """Delay after the given failed attempt (1-based), with up to 10 % jitter."""
        delay = self.backoff_base * 2 ** (attempt - 1)
        return min(self.max_delay, delay + random.uniform(0, delay / 10))

    def after_reply(self, reply: HttpReply, request: HttpRequest, attempt: int) -> Optional[float]:
        """Seconds to wait before resending after this reply, or None to keep it."""
        if reply.status != 503 or attempt >= (request.attempts or self.attempts):
            return None
        hint = reply.retry_after
        return self.backoff(attempt) if hint is None else min(hint, self.max_delay)

    def after_error(self, exc: BaseException, request: HttpRequest, attempt: int) -> Optional[float]:
        """Seconds to wait before resending after a transport error, or None to raise it."""
        if attempt >= (request.attempts or self.attempts) or not isinstance(exc, httpx.TransportError):
            return None
        if isinstance(exc, NOT_SENT) or request.idempotent:
            return self.backoff(attempt)
        return None


# ---------------------------------------------------------------- parsing
def request_timeout(request: HttpRequest, default: Optional[float]) -> Any:
    """The httpx timeout for one request: the client default, with a longer read for long waits."""
    if request.read_timeout is None:
        return httpx.USE_CLIENT_DEFAULT
    return httpx.Timeout(default, read=request.read_timeout)


def parse(reply: HttpReply, request: HttpRequest, model: type[M]) -> M:
    """Validate a 2xx reply into ``model``; raise the typed error a non-2xx reply describes."""
    if not reply.ok:
        raise error_for(reply, request)
    try:
        return model.model_validate(reply.body)
    except ValidationError as exc:
        raise errors.ServerError(f"unexpected reply to {request.method} {request.path}: {exc}") from exc


def error_for(reply: HttpReply, request: HttpRequest) -> errors.OrchardError:
    """The typed error for a failed reply; a bare 404 on a sandbox route becomes SandboxNotFoundError."""
    err = errors.error_from_response(reply.status, reply.body, reply.retry_after)
    if type(err) is errors.NotFoundError and request.not_found is not errors.NotFoundError:
        err = request.not_found(err.detail, status_code=404)
    return err


def parse_job(reply: HttpReply, request: HttpRequest) -> Union[p.Job, p.ExecQueued]:
    """Parse an exec reply: the full job, or just ``{job_id, status}`` from a server that did not wait."""
    if reply.ok and isinstance(reply.body, dict) and "sandbox_id" not in reply.body:
        return parse(reply, request, p.ExecQueued)
    return parse(reply, request, p.Job)


def route_missing(reply: HttpReply) -> bool:
    """True when a 404 comes from the router (no such route), not from a missing sandbox or job."""
    return reply.status == 404 and isinstance(reply.body, dict) and reply.body.get("detail") == "Not Found"


def build(model: type[M], **fields: Any) -> M:
    """Build a request model, turning a validation failure into ``RequestError``."""
    try:
        return model(**fields)
    except ValidationError as exc:
        raise errors.RequestError(str(exc), status_code=422) from exc


def _sandbox_path(sandbox_id: str, tail: str = "") -> str:
    """The path of a sandbox route, with the id quoted."""
    return f"/sandboxes/{quote(sandbox_id, safe='')}{tail}"


def _job_path(job_id: str, tail: str = "") -> str:
    """The path of a job route, with the id quoted."""
    return f"/jobs/{quote(job_id, safe='')}{tail}"


def _whole_seconds(seconds: Optional[float]) -> Optional[int]:
    """Round a duration up to whole seconds (at least 1), as the wire wants."""
    return None if seconds is None else max(1, math.ceil(seconds))


def _remaining(deadline: Optional[float]) -> Optional[float]:
    """Seconds left before ``deadline`` (None: no deadline)."""
    return None if deadline is None else deadline - time.monotonic()


def _expired(deadline: Optional[float], margin: float = 0.0) -> bool:
    """True when fewer than ``margin`` seconds are left before ``deadline`` (never without one)."""
    return deadline is not None and deadline - time.monotonic() <= margin


def _chunk(remaining: Optional[float], most: float = WAIT_CHUNK) -> float:
    """How long one wait may last: ``most``, or less when less time is left."""
    return most if remaining is None else max(0.0, min(remaining, most))


def _is_ready(info: p.SandboxInfo) -> bool:
    """True when ready; raise when the sandbox failed or is gone; False while it is still coming up."""
    if info.status == "failed":
        raise errors.SandboxFailedError(info.status_message or f"Sandbox {info.sandbox_id} failed")
    if info.status == "not_found":
        raise errors.SandboxNotFoundError(info.status_message or f"Sandbox {info.sandbox_id} not found")
    return info.status == "ready"


def _not_ready(sandbox_id: str, timeout: Optional[float]) -> errors.SandboxTimeoutError:
    """The error for a sandbox that was not ready in time."""
    return errors.SandboxTimeoutError(f"Sandbox {sandbox_id} did not become ready within {timeout}s")


def _job_complete(job: p.Job) -> bool:
    """True once a job has ended."""
    return job.status in ("succeeded", "failed")


# ---------------------------------------------------------------- the shared client core
class ClientCore:
    """Everything both clients do that is not I/O: config, tracked sandboxes and one flow per operation."""

    def __init__(self, config: ClientConfig):
        self.config = config
        self._retry = RetryPolicy()
        self._exec_grace = EXEC_GRACE
        self._repoll_pause = 0.5
        self._tracked: set[str] = set()

    # -- plumbing
    def default_headers(self) -> dict[str, str]:
        """Headers sent with every request: auth (when a key is set) and the SDK's user agent."""
        headers = {"User-Agent": f"orchard-python/{SDK_VERSION}", "Accept": "application/json"}
        if self.config.api_key:
            headers["X-API-Key"] = self.config.api_key
        return headers

    def tracked(self) -> list[str]:
        """Ids of the sandboxes this client created and has not deleted."""
        return sorted(self._tracked)

    def _call(self, request: HttpRequest) -> Flow[HttpReply]:
        """Send ``request`` with the retry policy; return the last reply whatever its status."""
        for attempt in itertools.count(1):
            try:
                reply = yield request
            except httpx.TransportError as exc:
                delay = self._retry.after_error(exc, request, attempt)
                if delay is None:
                    raise errors.ServiceUnreachableError(
                        f"{request.method} {request.path}: no reply from the service ({type(exc).__name__}: {exc})") from exc
            else:
                delay = self._retry.after_reply(reply, request, attempt)
                if delay is None:
                    return reply
            yield Sleep(delay)

    def _fetch(self, request: HttpRequest, model: type[M]) -> Flow[M]:
        """Send with retries and parse the reply into ``model``."""
        reply = yield from self._call(request)
        return parse(reply, request, model)

    def _long_read(self, wait_seconds: Optional[float]) -> Optional[float]:
        """An HTTP read timeout that outlasts a server-side wait of ``wait_seconds`` (None: no limit)."""
        if self.config.timeout is None:
            return None
        return max(self.config.timeout, (wait_seconds or 0) + READ_MARGIN)

    def new_sandbox_id(self) -> Optional[str]:
        """A prefixed id when SANDBOX_PREFIX is set; None lets the server pick one."""
        if not self.config.prefix:
            return None
        return f"{self.config.prefix}-{uuid4().hex[:12]}".lower()

    # -- service
    def health_flow(self) -> Flow[p.Health]:
        """GET /health."""
        return (yield from self._fetch(HttpRequest("GET", "/health"), p.Health))

    def resources_flow(self) -> Flow[p.ResourcesResponse]:
        """GET /resources."""
        return (yield from self._fetch(HttpRequest("GET", "/resources"), p.ResourcesResponse))

    def list_flow(self, status: Optional[str] = None) -> Flow[list[p.SandboxInfo]]:
        """GET /sandboxes, optionally filtered by status."""
        params = {"status": status} if status else None
        listing = yield from self._fetch(HttpRequest("GET", "/sandboxes", params=params), p.SandboxList)
        return listing.sandboxes

    # -- sandbox lifecycle
    def create_body(self, image: str, block_network: bool, sandbox_id: Optional[str], cpu: Any, memory: Any,
                    timeout: Optional[float], extra: dict[str, Any]) -> dict[str, Any]:
        """The POST /sandboxes body; extra keys the model does not know are passed through as given."""
        known = {k: v for k, v in extra.items() if k in p.CreateSandboxRequest.model_fields}
        req = build(p.CreateSandboxRequest, image=image, block_network=block_network,
                    sandbox_id=sandbox_id or self.new_sandbox_id(), cpu=_quantity(cpu),
                    memory=_quantity(memory), timeout=_whole_seconds(timeout), **known)
        body = req.model_dump(mode="json", exclude_unset=True)
        body.update({k: v for k, v in extra.items() if k not in known})
        return body

    def create_flow(self, body: dict[str, Any], wait_ready: bool, timeout: Optional[float],
                    poll_interval: float) -> Flow[p.CreateSandboxResponse]:
        """POST /sandboxes, track the new sandbox, then wait for it unless told not to."""
        created = yield from self._fetch(HttpRequest("POST", "/sandboxes", json=body), p.CreateSandboxResponse)
        self._tracked.add(created.sandbox_id)
        if wait_ready and created.status != "ready":
            yield from self._wait_or_discard(created.sandbox_id, timeout, poll_interval)
        return created

    def _wait_or_discard(self, sandbox_id: str, timeout: Optional[float], poll_interval: float) -> Flow[p.SandboxInfo]:
        """Wait for readiness; a sandbox that failed or timed out is deleted (with auto_cleanup) before raising."""
        try:
            return (yield from self.wait_flow(sandbox_id, timeout, poll_interval))
        except errors.SandboxNotFoundError:
            self._tracked.discard(sandbox_id)
            raise
        except (errors.SandboxFailedError, errors.SandboxTimeoutError):
            if self.config.auto_cleanup:
                yield from self._quiet_delete(sandbox_id)
            raise

    def _quiet_delete(self, sandbox_id: str) -> Flow[None]:
        """Delete a sandbox, ignoring any failure (used while already raising)."""
        try:
            yield from self.delete_flow(sandbox_id)
        except (errors.OrchardError, httpx.HTTPError):
            pass

    def wait_flow(self, sandbox_id: str, timeout: Optional[float],
                  poll_interval: float = 1.0) -> Flow[p.SandboxInfo]:
        """Block on GET /sandboxes/{id}/wait until ready; poll GET /sandboxes/{id} if the route is missing."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not _expired(deadline):
            request = self._wait_request(sandbox_id, _remaining(deadline))
            reply = yield from self._call(request)
            if route_missing(reply):
                return (yield from self._poll_ready(sandbox_id, deadline, timeout, poll_interval))
            if reply.status != 408 and _is_ready(info := parse(reply, request, p.SandboxInfo)):
                return info
            yield Sleep(_chunk(_remaining(deadline), poll_interval))  # never spin on a fast 408
        raise _not_ready(sandbox_id, timeout)

    def _wait_request(self, sandbox_id: str, remaining: Optional[float]) -> HttpRequest:
        """One GET /sandboxes/{id}/wait of at most WAIT_CHUNK seconds."""
        seconds = _whole_seconds(_chunk(remaining))
        return HttpRequest("GET", _sandbox_path(sandbox_id, "/wait"), params={"timeout": seconds},
                           read_timeout=self._long_read(seconds), not_found=errors.SandboxNotFoundError)

    def _poll_ready(self, sandbox_id: str, deadline: Optional[float], timeout: Optional[float],
                    poll_interval: float) -> Flow[p.SandboxInfo]:
        """The fallback for servers without /wait: GET the sandbox every ``poll_interval``."""
        while True:
            info = yield from self.info_flow(sandbox_id)
            if _is_ready(info):
                return info
            if _expired(deadline, poll_interval):
                raise _not_ready(sandbox_id, timeout)
            yield Sleep(poll_interval)

    def info_flow(self, sandbox_id: str) -> Flow[p.SandboxInfo]:
        """GET /sandboxes/{id}."""
        request = HttpRequest("GET", _sandbox_path(sandbox_id), not_found=errors.SandboxNotFoundError)
        return (yield from self._fetch(request, p.SandboxInfo))

    def delete_flow(self, sandbox_id: str, attempts: Optional[int] = None) -> Flow[p.DeleteResponse]:
        """DELETE /sandboxes/{id}; an unknown id counts as deleted."""
        request = HttpRequest("DELETE", _sandbox_path(sandbox_id), attempts=attempts)
        reply = yield from self._call(request)
        result = p.DeleteResponse(sandbox_id=sandbox_id) if reply.status == 404 else parse(
            reply, request, p.DeleteResponse)
        self._tracked.discard(sandbox_id)
        return result

    def heartbeat_flow(self, sandbox_id: str) -> Flow[p.HeartbeatResponse]:
        """POST /sandboxes/{id}/heartbeat (safe to resend)."""
        request = HttpRequest("POST", _sandbox_path(sandbox_id, "/heartbeat"), idempotent=True,
                              not_found=errors.SandboxNotFoundError)
        return (yield from self._fetch(request, p.HeartbeatResponse))

    def snapshot_flow(self, sandbox_id: str, image: str) -> Flow[p.SnapshotResponse]:
        """POST /sandboxes/{id}/snapshot."""
        body = build(p.SnapshotRequest, image=image).model_dump(mode="json")
        request = HttpRequest("POST", _sandbox_path(sandbox_id, "/snapshot"), json=body,
                              read_timeout=self._long_read(None), not_found=errors.SandboxNotFoundError)
        return (yield from self._fetch(request, p.SnapshotResponse))

    # -- exec and jobs
    def exec_flow(self, sandbox_id: str, command: Union[str, list[str]], timeout: Optional[float] = None,
                  cwd: Optional[str] = None, env: Optional[dict[str, str]] = None,
                  login_shell: bool = False) -> Flow[JobResult]:
        """POST /sandboxes/{id}/exec with an idempotency key, then wait on /jobs/{id}/wait until it ends."""
        body = build(p.ExecRequest, command=command, timeout_seconds=_whole_seconds(timeout), cwd=cwd,
                     env=env, login_shell=login_shell, wait=True).model_dump(mode="json")
        deadline = None if timeout is None else time.monotonic() + timeout + self._exec_grace
        request = HttpRequest("POST", _sandbox_path(sandbox_id, "/exec"), json=body,
                              headers={"Idempotency-Key": uuid4().hex}, idempotent=True,
                              read_timeout=self._long_read(timeout), not_found=errors.SandboxNotFoundError)
        reply = yield from self._call(request)
        return (yield from self._finish_job(parse_job(reply, request), deadline, timeout))

    def _finish_job(self, job: Union[p.Job, p.ExecQueued], deadline: Optional[float],
                    timeout: Optional[float]) -> Flow[JobResult]:
        """Wait on /jobs/{id}/wait (or poll /jobs/{id} if that route is missing) until the job ends."""
        path = _job_path(job.job_id, "/wait")
        while not _job_complete(job):
            if _expired(deadline):
                raise errors.SandboxTimeoutError(
                    f"Job {job.job_id} did not finish within {timeout}s (+{self._exec_grace}s grace)")
            request = self._job_wait_request(path, _remaining(deadline))
            reply = yield from self._call(request)
            if route_missing(reply) and path.endswith("/wait"):
                path = _job_path(job.job_id)
                continue
            job = job if reply.status == 408 else parse(reply, request, p.Job)
            if not _job_complete(job):
                yield Sleep(self._repoll_pause)
        return JobResult.from_job(job)

    def _job_wait_request(self, path: str, remaining: Optional[float]) -> HttpRequest:
        """One GET /jobs/{id}/wait of at most WAIT_CHUNK seconds (or a plain GET when polling)."""
        if not path.endswith("/wait"):
            return HttpRequest("GET", path)
        seconds = _whole_seconds(_chunk(remaining))
        return HttpRequest("GET", path, params={"timeout": seconds}, read_timeout=self._long_read(seconds))

    def job_flow(self, job_id: str) -> Flow[JobResult]:
        """GET /jobs/{id}."""
        job = yield from self._fetch(HttpRequest("GET", _job_path(job_id)), p.Job)
        return JobResult.from_job(job)

    def apply_patch_flow(self, sandbox_id: str, patch: str, timeout: float = 30,
                         cwd: Optional[str] = None) -> Flow[p.ApplyPatchResponse]:
        """POST /sandboxes/{id}/apply_patch."""
        body = build(p.ApplyPatchRequest, patch=patch, timeout_seconds=_whole_seconds(timeout),
                     cwd=cwd).model_dump(mode="json")
        request = HttpRequest("POST", _sandbox_path(sandbox_id, "/apply_patch"), json=body,
                              read_timeout=self._long_read(timeout), not_found=errors.SandboxNotFoundError)
        return (yield from self._fetch(request, p.ApplyPatchResponse))

    # -- files
    def upload_flow(self, sandbox_id: str, content: Union[bytes, str], remote_path: str,
                    mode: Optional[int] = None) -> Flow[p.UploadResponse]:
        """POST /sandboxes/{id}/files with the content base64-encoded."""
        data = content.encode("utf-8") if isinstance(content, str) else bytes(content)
        body = build(p.UploadRequest, path=remote_path, content=base64.b64encode(data).decode("ascii"),
                     mode=mode).model_dump(mode="json")
        request = HttpRequest("POST", _sandbox_path(sandbox_id, "/files"), json=body)
        return (yield from self._fetch(request, p.UploadResponse))

    def download_flow(self, sandbox_id: str, remote_path: str) -> Flow[bytes]:
        """GET /sandboxes/{id}/files?path=P and decode the content."""
        request = HttpRequest("GET", _sandbox_path(sandbox_id, "/files"), params={"path": remote_path})
        reply = yield from self._fetch(request, p.DownloadResponse)
        return base64.b64decode(reply.content)

    def list_files_flow(self, sandbox_id: str, remote_path: str) -> Flow[list[p.FileEntry]]:
        """GET /sandboxes/{id}/files/list?path=P."""
        request = HttpRequest("GET", _sandbox_path(sandbox_id, "/files/list"), params={"path": remote_path})
        listing = yield from self._fetch(request, p.ListFilesResponse)
        return listing.files

    # -- PTY
    def pty_url(self, sandbox_id: str) -> str:
        """The PTY WebSocket URL: the base URL with http(s) turned into ws(s)."""
        url = re.sub(r"^http", "ws", self.config.base_url, count=1)
        return url + _sandbox_path(sandbox_id, "/exec/pty")

    def pty_subprotocols(self) -> list[str]:
        """WebSocket subprotocols carrying the API key, when one is set."""
        return [f"api_key.{self.config.api_key}"] if self.config.api_key else []

    def pty_init(self, command: Union[str, list[str]], cwd: Optional[str], env: Optional[dict[str, str]],
                 login_shell: bool, rows: int = 24, cols: int = 80) -> p.PtyInit:
        """The first PTY frame: a string command runs under bash, a list is an argv."""
        cmd = ["bash", "-c", command] if isinstance(command, str) else list(command)
        return build(p.PtyInit, cmd=cmd, env=env or {}, cwd=cwd, rows=rows, cols=cols, login_shell=login_shell)


def _quantity(value: Any) -> Optional[str]:
    """Send CPU and memory as strings (the wire form), accepting numbers for convenience."""
    return None if value is None else str(value)
