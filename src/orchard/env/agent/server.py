"""The agent's HTTP server: token check, then exec, files and terminals inside the sandbox (stdlib only).

Started as the sandbox container's main process (``python -I -c <boot_code('server')>``). The token
comes from a file the init container wrote into an in-memory volume; the agent reads it, deletes it
and makes itself non-dumpable, so the sandbox's own processes (which run without capabilities) can
read the token neither from the file, nor from the agent's environment or memory. When the pod names
a model endpoint (``RELAY_ENV``), the agent starts its relay (relay.py) before it serves.
"""

from __future__ import annotations

import base64
import ctypes
import hmac
import json
import os
import signal
import socket
import socketserver
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional
from urllib.parse import parse_qs, urlsplit

from . import (BAD_REQUEST, DEFAULT_PORT, EXEC, FILE, FORBIDDEN, HEALTH, INFO, LIST, NOT_FOUND, PORT_ENV, PTY, PTY_CONTROL,
               RELAY_ENV, TOKEN_ENV, TOKEN_FILE, TOKEN_FILE_ENV, TOO_LARGE, TOKEN_HEADER, UNAUTHORIZED)
from . import execute, files, relay, terminal

MAX_BODY = 1 << 30
WORKSPACE = "/workspace"
_STATUS = {NOT_FOUND: 404, BAD_REQUEST: 400, TOO_LARGE: 413, UNAUTHORIZED: 401, FORBIDDEN: 403}


class AgentServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple, token: str):
        super().__init__(address, Handler)
        self.token = token.encode()
        self.sessions: dict = {}
        self.lock = threading.Lock()

    def server_bind(self) -> None:
        """Bind without HTTPServer's reverse DNS lookup (a sandbox's DNS may be unreachable: start must not wait)."""
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "orchard-agent", self.server_address[1]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True      # a reply is headers then body: no 40 ms delayed-ACK stall between them
    server: AgentServer

    def log_message(self, *args) -> None:
        pass

    # ---------------------------------------------------------- plumbing
    def _query(self) -> dict:
        return {k: v[-1] for k, v in parse_qs(urlsplit(self.path).query).items()}

    def _route(self) -> str:
        return urlsplit(self.path).path

    def _body(self) -> bytes:
        return self.body

    def _read_body(self) -> bool:
        """Read the whole body first, so that no reply leaves bytes behind on a kept-alive connection."""
        size = int(self.headers.get("Content-Length") or 0)
        if size > MAX_BODY:
            self.close_connection = True
            self._problem(TOO_LARGE, "request body too large")
            return False
        self.body = self.rfile.read(size) if size else b""
        return True

    def _json(self) -> dict:
        try:
            body = json.loads(self._body() or b"{}")
        except ValueError as e:
            raise files.FileProblem(BAD_REQUEST, f"body is not JSON: {e}") from e
        if not isinstance(body, dict):
            raise files.FileProblem(BAD_REQUEST, "body must be a JSON object")
        return body

    def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _reply(self, value, status: int = 200) -> None:
        self._send(status, json.dumps(value).encode())

    def _problem(self, kind: str, message: str) -> None:
        self._reply({"error": kind, "message": message}, _STATUS.get(kind, 400))

    def _authorised(self) -> bool:
        given = self.headers.get(TOKEN_HEADER)
        if given is None:
            self._problem(UNAUTHORIZED, f"missing {TOKEN_HEADER}")
            return False
        if not hmac.compare_digest(given.encode(), self.server.token):
            self._problem(FORBIDDEN, "wrong agent token")
            return False
        return True

    def _dispatch(self, table: dict) -> None:
        if not self._read_body():
            return
        route = self._route()
        if route == HEALTH and self.command == "GET":
            return self._send(200, b"ok", "text/plain")
        if not self._authorised():
            return
        handler = table.get(route)
        if handler is None and route.startswith(PTY_CONTROL):
            handler = self._pty_control
        if handler is None:
            return self._problem(NOT_FOUND, f"no route {self.command} {route}")
        try:
            handler()
        except files.FileProblem as e:
            self._problem(e.kind, e.message)
        except (KeyError, TypeError, ValueError) as e:
            self._problem(BAD_REQUEST, f"bad request: {e!r}")

    def do_GET(self) -> None:
        self._dispatch({FILE: self._read_file, LIST: self._list, INFO: self._info})

    def do_PUT(self) -> None:
        self._dispatch({FILE: self._write_file})

    def do_POST(self) -> None:
        self._dispatch({EXEC: self._exec, PTY: self._pty})

    # ---------------------------------------------------------- operations
    def _exec(self) -> None:
        req = self._json()
        argv = req["argv"]
        if not argv or not all(isinstance(a, str) for a in argv):
            raise files.FileProblem(BAD_REQUEST, "argv must be a non-empty list of strings")
        out = execute.run(argv, req.get("cwd") or "/", req.get("env") or {}, float(req.get("timeout", 300)),
                          int(req.get("output_limit", 16 << 20)))
        out["stdout"] = base64.b64encode(out["stdout"]).decode()
        out["stderr"] = base64.b64encode(out["stderr"]).decode()
        self._reply(out)

    def _info(self) -> None:
        has_bash = any(os.access(p, os.X_OK) for p in ("/bin/bash", "/usr/bin/bash"))
        self._reply({"workdir": os.getcwd(), "has_bash": has_bash, "pid": os.getpid()})

    def _read_file(self) -> None:
        q = self._query()
        self._send(200, files.read(q["path"], int(q.get("limit", MAX_BODY))), "application/octet-stream")

    def _write_file(self) -> None:
        q = self._query()
        mode = int(q["mode"]) if q.get("mode") not in (None, "") else None
        files.write(q["path"], self._body(), mode)
        self._send(204, b"")

    def _list(self) -> None:
        self._reply(files.listing(self._query()["path"]))

    def _pty(self) -> None:
        req = self._json()
        session = terminal.Session(req["argv"], req.get("cwd") or "/", req.get("env") or {},
                                   int(req.get("rows", 24)), int(req.get("cols", 80)))
        with self.server.lock:
            self.server.sessions[session.id] = session
        self.send_response(200)
        self.send_header("X-Orchard-Pty", session.id)
        self.send_header("X-Orchard-Pid", str(session.proc.pid))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        session.relay(self.connection)

    def _pty_control(self) -> None:
        _, _, sid, action = (self._route().split("/") + ["", ""])[:5][1:5]
        session = self.server.sessions.get(sid)
        if session is None:
            raise files.FileProblem(NOT_FOUND, f"no terminal session {sid}")
        if action == "wait" and self.command == "GET":
            if session.ended.wait(min(float(self._query().get("timeout", 30)), 300)):
                with self.server.lock:
                    self.server.sessions.pop(sid, None)
            return self._reply({"exit_code": session.code, "ended": session.ended.is_set()})
        req = self._json()
        if action == "resize":
            terminal.resize(session.master, int(req["rows"]), int(req["cols"]))
        elif action == "signal":
            session.signal(int(req["signal"]))
        elif action == "kill":
            session.kill()
        else:
            raise files.FileProblem(NOT_FOUND, f"no terminal action {action!r}")
        self._reply({"ok": True})


# -------------------------------------------------------------- start
def read_token() -> str:
    """The token from its file (deleted once read), else from the environment (tests)."""
    path = os.environ.get(TOKEN_FILE_ENV, TOKEN_FILE)
    try:
        with open(path) as f:
            token = f.read().strip()
        os.unlink(path)
    except FileNotFoundError:
        token = os.environ.get(TOKEN_ENV, "")
    if not token:
        sys.exit(f"orchard agent: no token in {path} or ${TOKEN_ENV}")
    return token


def _not_dumpable() -> None:
    """PR_SET_DUMPABLE 0: capability-less processes of the same user cannot read our memory or environ."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _enter_workdir() -> None:
    """Commands start in the image's working directory; when it names none, /workspace (made here), or for an
    image whose user may not create it, that user's home."""
    if os.getcwd() != "/":
        return
    for place in (WORKSPACE, os.environ.get("HOME") or "/"):
        try:
            os.makedirs(place, exist_ok=True)
            os.chdir(place)
            return
        except OSError:
            continue


class DualStackServer(AgentServer):
    address_family = socket.AF_INET6

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def serve(port: int, token: str, host: str = "") -> AgentServer:
    """Listen on ``host``; by default on every IPv6 and IPv4 address (IPv4 only where IPv6 is off)."""
    if host:
        return AgentServer((host, port), token)
    try:
        return DualStackServer(("::", port), token)
    except OSError:
        return AgentServer(("0.0.0.0", port), token)


def main(argv: Optional[list] = None) -> None:
    token = read_token()
    for name in (TOKEN_ENV, TOKEN_FILE_ENV):
        os.environ.pop(name, None)
    _not_dumpable()
    _enter_workdir()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    _start_relay()
    server = serve(int(os.environ.get(PORT_ENV, DEFAULT_PORT)), token)
    if os.getpid() == 1:
        threading.Thread(target=_reap_orphans, daemon=True).start()
    server.serve_forever()


def _start_relay() -> None:
    """The model-endpoint relay, when the pod names one; a relay that cannot listen fails the pod, saying why."""
    try:
        relay.start(os.environ.get(RELAY_ENV))
    except (OSError, ValueError) as e:
        sys.exit(f"orchard agent: model endpoint relay {os.environ.get(RELAY_ENV)!r}: {e}")


def _reap_orphans() -> None:
    """As PID 1, reap orphans that re-parent to us, never a child a request still waits for."""
    import time
    while True:
        time.sleep(1.0)
        with execute.SPAWN_LOCK:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                continue
            if info is not None and info.si_pid not in execute.OWN:
                os.waitpid(info.si_pid, os.WNOHANG)
