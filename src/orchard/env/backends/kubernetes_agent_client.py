"""The Kubernetes backend's side of the in-pod agent: HTTP calls over the pod IP, with the sandbox's token."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
from dataclasses import dataclass
from typing import Optional

import httpx

from orchard import errors
from orchard.env import agent
from orchard.env.backends.base import ExecOutcome, ExecSpec
from orchard.env.protocol import FileEntry

SLACK = 30.0                 # seconds an exec's HTTP call may take beyond its own timeout
CALL_TIMEOUT = 120.0         # file and control calls
PTY_WAIT = 30.0              # one long poll of a terminal's exit


@dataclass(frozen=True)
class Agent:
    """Where one sandbox's agent answers, and the token it wants."""

    sandbox_id: str
    host: str
    port: int
    token: str

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


class AgentClient:
    """One pooled HTTP client for every agent (at most ``pool`` connections at once)."""

    def __init__(self, pool: int):
        self.http = httpx.AsyncClient(limits=httpx.Limits(max_connections=pool, max_keepalive_connections=pool),
                                      timeout=CALL_TIMEOUT, trust_env=False)

    async def close(self) -> None:
        await self.http.aclose()

    async def _call(self, target: Agent, method: str, path: str, *, timeout: float = CALL_TIMEOUT,
                    **kwargs) -> httpx.Response:
        headers = {agent.TOKEN_HEADER: target.token}
        try:
            resp = await self.http.request(method, target.url + path, headers=headers, timeout=timeout, **kwargs)
        except httpx.HTTPError as e:
            raise errors.BackendError(f"The agent of sandbox {target.sandbox_id} cannot be reached: {e!r}") from e
        if resp.status_code >= 400:
            raise _problem(target, resp)
        return resp

    async def info(self, target: Agent) -> dict:
        return (await self._call(target, "GET", agent.INFO)).json()

    async def exec(self, target: Agent, spec: ExecSpec, cwd: str, env: dict[str, str]) -> ExecOutcome:
        body = {"argv": spec.argv, "cwd": cwd, "env": env, "timeout": spec.timeout, "output_limit": spec.output_limit}
        out = (await self._call(target, "POST", agent.EXEC, json=body, timeout=spec.timeout + SLACK)).json()
        return ExecOutcome(exit_code=out["exit_code"], stdout=base64.b64decode(out["stdout"]),
                           stderr=base64.b64decode(out["stderr"]), stdout_truncated=out["stdout_truncated"],
                           stderr_truncated=out["stderr_truncated"], error=out["error"], started_at=out["started_at"])

    async def read_file(self, target: Agent, path: str, limit: int) -> bytes:
        return (await self._call(target, "GET", agent.FILE, params={"path": path, "limit": limit})).content

    async def write_file(self, target: Agent, path: str, data: bytes, mode: Optional[int]) -> None:
        params = {"path": path, "mode": "" if mode is None else str(mode)}
        await self._call(target, "PUT", agent.FILE, params=params, content=data)

    async def list_dir(self, target: Agent, path: str) -> list[FileEntry]:
        entries = (await self._call(target, "GET", agent.LIST, params={"path": path})).json()
        return [FileEntry(**e) for e in entries]

    async def open_pty(self, target: Agent, argv: list[str], cwd: str, env: dict[str, str], rows: int,
                       cols: int) -> "AgentPty":
        body = json.dumps({"argv": argv, "cwd": cwd, "env": env, "rows": rows, "cols": cols}).encode()
        try:
            sock, headers = await asyncio.to_thread(_open_stream, target, body)
        except OSError as e:
            raise errors.BackendError(f"The agent of sandbox {target.sandbox_id} cannot be reached: {e!r}") from e
        return AgentPty(self, target, sock, headers["x-orchard-pty"], int(headers.get("x-orchard-pid", "0")))


def _problem(target: Agent, resp: httpx.Response) -> errors.OrchardError:
    try:
        body = resp.json()
        message = body.get("message") or resp.text
    except ValueError:
        message = resp.text[-500:]
    if resp.status_code in (401, 403):
        return errors.BackendError(f"The agent of sandbox {target.sandbox_id} refused the service's token: {message}")
    if resp.status_code == 404:
        return errors.NotFoundError(message)
    if resp.status_code == 413:
        return errors.PayloadTooLargeError(message)
    if resp.status_code < 500:
        return errors.RequestError(message, status_code=400)
    return errors.BackendError(f"The agent of sandbox {target.sandbox_id} failed: {message}")


def _open_stream(target: Agent, body: bytes) -> tuple[socket.socket, dict[str, str]]:
    """POST the terminal request on a fresh connection and return it, past the reply's headers, as the stream."""
    sock = socket.create_connection((target.host, target.port), timeout=CALL_TIMEOUT)
    request = (f"POST {agent.PTY} HTTP/1.1\r\nHost: {target.host}\r\n{agent.TOKEN_HEADER}: {target.token}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    sock.sendall(request)
    head = b""
    while not head.endswith(b"\r\n\r\n"):        # byte by byte: what follows the headers is the terminal's
        byte = sock.recv(1)
        if not byte:
            raise ConnectionError("the agent closed the terminal connection before replying")
        head += byte
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if line)}
    if " 200 " not in status + " ":
        sock.close()
        raise ConnectionError(f"the agent refused the terminal: {status}")
    sock.setblocking(False)
    return sock, headers


class AgentPty:
    """A terminal inside the pod (see base.PtyProcess): master_fd is the raw stream's socket."""

    def __init__(self, client: AgentClient, target: Agent, sock: socket.socket, session: str, pid: int):
        self.client, self.target, self.sock, self.session, self.pid = client, target, sock, session, pid
        self.master_fd = sock.fileno()
        self._tasks: set[asyncio.Task] = set()

    def _control(self, action: str, body: dict) -> None:
        task = asyncio.get_running_loop().create_task(
            self.client._call(self.target, "POST", f"{agent.PTY_CONTROL}{self.session}/{action}", json=body))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def resize(self, rows: int, cols: int) -> None:
        self._control("resize", {"rows": rows, "cols": cols})

    def signal(self, sig: int) -> None:
        self._control("signal", {"signal": int(sig)})

    async def wait(self) -> int:
        path = f"{agent.PTY_CONTROL}{self.session}/wait"
        while True:
            reply = (await self.client._call(self.target, "GET", path, params={"timeout": PTY_WAIT},
                                             timeout=PTY_WAIT + SLACK)).json()
            if reply["ended"]:
                return int(reply["exit_code"])

    async def kill(self) -> None:
        try:
            await self.client._call(self.target, "POST", f"{agent.PTY_CONTROL}{self.session}/kill", json={})
        except errors.OrchardError:
            pass                                  # already gone, or the pod with it
        finally:
            self.sock.close()
