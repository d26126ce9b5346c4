"""Interactive processes over the PTY WebSocket of env-api.md ("PTY WebSocket"), blocking and asyncio twins.

``websockets`` is imported only when a session opens, so the SDK core needs httpx and
pydantic alone; install the extra with ``pip install 'orchard[pty]'``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import signal as _signal
import time
from collections import deque
from typing import Any, Optional, Union

from pydantic import TypeAdapter, ValidationError

from orchard import errors
from orchard.client.base import HttpReply, HttpRequest, build, error_for
from orchard.env import protocol as p

MAX_FRAME = 32 * 1024 * 1024
_SERVER_FRAME: TypeAdapter = TypeAdapter(p.PtyServerFrame)
_INSTALL_HINT = "The PTY needs the 'websockets' package: pip install 'orchard[pty]'"


def _sync_connect():
    """The blocking websockets connect, or an ImportError naming the extra to install."""
    try:
        from websockets.sync.client import connect
    except ImportError as exc:
        raise ImportError(_INSTALL_HINT) from exc
    return connect


def _async_connect():
    """The asyncio websockets connect (new or legacy API), or an ImportError naming the extra."""
    try:
        from websockets.asyncio.client import connect        # websockets >= 13
    except ImportError:
        try:
            from websockets.client import connect             # websockets 12 (legacy asyncio client)
        except ImportError as exc:
            raise ImportError(_INSTALL_HINT) from exc
    return connect


def _closed_types() -> tuple[type[BaseException], ...]:
    """The websockets exception for a closed connection."""
    from websockets.exceptions import ConnectionClosed
    return (ConnectionClosed,)


def _handshake_error(exc: BaseException) -> Optional[errors.OrchardError]:
    """The typed error for a refused handshake (401, 403, 404 ...), or None if it was not an HTTP refusal."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None) or getattr(exc, "status_code", None)
    if not status:
        return None
    body = getattr(response, "body", b"") or b""
    request = HttpRequest("GET", "/exec/pty", not_found=errors.SandboxNotFoundError)
    return error_for(HttpReply.from_raw(int(status), {}, body), request)


def _signal_name(sig: Union[str, int]) -> str:
    """Accept 'INT', 'SIGINT', signal.SIGINT or 2; return the wire name 'INT'."""
    name = _signal.Signals(sig).name if isinstance(sig, int) else str(sig).upper()
    return name[3:] if name.startswith("SIG") else name


class PtySession:
    """The I/O-free half of a PTY process: frames to send and what each frame received means."""

    def __init__(self) -> None:
        self.pid: Optional[int] = None
        self.returncode: Optional[int] = None
        self.error: Optional[str] = None
        self.error_name: Optional[str] = None
        self.eof = False
        self.chunks: deque[bytes] = deque()

    @staticmethod
    def stdin(data: Union[bytes, str]) -> str:
        """A stdin frame carrying ``data`` (text is sent as UTF-8)."""
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        return p.PtyStdin(data=base64.b64encode(raw).decode("ascii")).model_dump_json()

    @staticmethod
    def resize(rows: int, cols: int) -> str:
        """A resize frame."""
        return build(p.PtyResize, rows=rows, cols=cols).model_dump_json()

    @staticmethod
    def signal(sig: Union[str, int]) -> str:
        """A signal frame; the name must be one of INT, TERM, KILL, HUP, QUIT."""
        return build(p.PtySignal, sig=_signal_name(sig)).model_dump_json()

    @staticmethod
    def close() -> str:
        """The close frame."""
        return p.PtyClose().model_dump_json()

    def feed(self, text: Any) -> None:
        """Take in one server frame; frames of unknown type are ignored."""
        try:
            raw = json.loads(text)
            frame = _SERVER_FRAME.validate_python(raw)
        except (ValueError, ValidationError):
            return
        if isinstance(frame, p.PtyReady):
            self.pid = frame.pid
        elif isinstance(frame, p.PtyStdout):
            self.chunks.append(base64.b64decode(frame.data))
        elif isinstance(frame, p.PtyExit):
            self.returncode, self.eof = frame.code, True
        elif isinstance(frame, p.PtyError):
            self.error, self.error_name = frame.message, raw.get("error")

    def connection_closed(self, code: Optional[int]) -> None:
        """Record the end of the socket; raise if it ended on an error or before the process exited."""
        self.eof = True
        if self.error is not None:
            body = {"detail": self.error, "error": self.error_name}
            raise errors.error_from_response(400 if code == 4400 else 500, body)
        if self.returncode is None:
            raise errors.SandboxError(f"PTY connection closed (code {code}) before the process exited")

    def take(self) -> bytes:
        """The next buffered chunk, or b"" at end of output."""
        return self.chunks.popleft() if self.chunks else b""

    def started(self) -> bool:
        """True once the server said ready (or the process already ended)."""
        return self.pid is not None or self.eof


def _close_code(exc: BaseException) -> Optional[int]:
    """The close code the server sent, if any."""
    return getattr(getattr(exc, "rcvd", None), "code", None)


def _left(deadline: Optional[float]) -> Optional[float]:
    """Seconds left before ``deadline``; SandboxTimeoutError once it has passed."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise errors.SandboxTimeoutError("timed out waiting for the PTY process")
    return left


def _deadline(timeout: Optional[float]) -> Optional[float]:
    """A monotonic deadline ``timeout`` seconds from now (None: none)."""
    return None if timeout is None else time.monotonic() + timeout


# ---------------------------------------------------------------- blocking
class PtyProcess:
    """A process on a pseudo-terminal in a sandbox, driven over a blocking WebSocket."""

    def __init__(self, ws: Any, session: PtySession, stack: contextlib.ExitStack):
        self._ws = ws
        self._session = session
        self._stack = stack
        self._closed = False

    @classmethod
    def open(cls, url: str, subprotocols: list[str], init: p.PtyInit, open_timeout: float = 30.0) -> "PtyProcess":
        """Connect, send the init frame and wait for the server's ready frame."""
        connect = _sync_connect()
        stack = contextlib.ExitStack()
        try:  # entered as a context, as websockets >= 17.1 expects; close() exits it
            ws = stack.enter_context(connect(url, subprotocols=subprotocols or None, open_timeout=open_timeout,
                                             max_size=MAX_FRAME))
        except Exception as exc:
            raise (_handshake_error(exc) or exc) from exc
        proc = cls(ws, PtySession(), stack)
        try:
            proc._send(init.model_dump_json())
            proc._start(open_timeout)
        except BaseException:
            proc.close()
            raise
        return proc

    @property
    def pid(self) -> Optional[int]:
        """The process id inside the sandbox."""
        return self._session.pid

    @property
    def returncode(self) -> Optional[int]:
        """The exit code once the process ended (negative: killed by that signal), else None."""
        return self._session.returncode

    def _start(self, timeout: float) -> None:
        """Read frames until the server says ready."""
        deadline = _deadline(timeout)
        while not self._session.started():
            self._pump(deadline)

    def _send(self, frame: str) -> None:
        """Send one frame; a closed socket becomes SandboxError."""
        try:
            self._ws.send(frame)
        except _closed_types() as exc:
            raise errors.SandboxError("the PTY session is closed") from exc

    def _pump(self, deadline: Optional[float]) -> None:
        """Receive one frame (or the end of the socket) into the session."""
        try:
            text = self._ws.recv(timeout=_left(deadline))
        except TimeoutError as exc:
            raise errors.SandboxTimeoutError("timed out waiting for the PTY process") from exc
        except _closed_types() as exc:
            self._session.connection_closed(_close_code(exc))
            return
        self._session.feed(text)

    def write(self, data: Union[bytes, str]) -> None:
        """Send bytes (or UTF-8 text) to the terminal's input."""
        self._send(PtySession.stdin(data))

    def read(self, timeout: Optional[float] = None) -> bytes:
        """The next chunk of terminal output; b"" at end of output; SandboxTimeoutError if none comes in time."""
        deadline = _deadline(timeout)
        while not self._session.chunks and not self._session.eof:
            self._pump(deadline)
        return self._session.take()

    def resize(self, rows: int, cols: int) -> None:
        """Resize the terminal."""
        self._send(PtySession.resize(rows, cols))

    def send_signal(self, name: Union[str, int]) -> None:
        """Send a signal (INT, TERM, KILL, HUP or QUIT) to the process."""
        self._send(PtySession.signal(name))

    def wait(self, timeout: Optional[float] = None) -> int:
        """Block until the process exits and return its exit code; output stays readable with ``read``."""
        deadline = _deadline(timeout)
        while self._session.returncode is None:
            self._pump(deadline)
        return self._session.returncode

    def close(self) -> None:
        """Tell the server to end the session (its process tree is killed) and close the socket."""
        if self._closed:
            return
        self._closed = True
        try:
            self._ws.send(PtySession.close())
        except Exception:
            pass
        self._stack.close()

    def __enter__(self) -> "PtyProcess":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


# ---------------------------------------------------------------- asyncio
class AsyncPtyProcess:
    """A process on a pseudo-terminal in a sandbox, driven over an asyncio WebSocket."""

    def __init__(self, ws: Any, session: PtySession):
        self._ws = ws
        self._session = session
        self._closed = False

    @classmethod
    async def open(cls, url: str, subprotocols: list[str], init: p.PtyInit,
                   open_timeout: float = 30.0) -> "AsyncPtyProcess":
        """Connect, send the init frame and wait for the server's ready frame."""
        connect = _async_connect()
        try:
            ws = await connect(url, subprotocols=subprotocols or None, open_timeout=open_timeout,
                               max_size=MAX_FRAME)
        except Exception as exc:
            raise (_handshake_error(exc) or exc) from exc
        proc = cls(ws, PtySession())
        try:
            await proc._send(init.model_dump_json())
            await proc._start(open_timeout)
        except BaseException:
            await proc.close()
            raise
        return proc

    @property
    def pid(self) -> Optional[int]:
        """The process id inside the sandbox."""
        return self._session.pid

    @property
    def returncode(self) -> Optional[int]:
        """The exit code once the process ended (negative: killed by that signal), else None."""
        return self._session.returncode

    async def _start(self, timeout: float) -> None:
        """Read frames until the server says ready."""
        deadline = _deadline(timeout)
        while not self._session.started():
            await self._pump(deadline)

    async def _send(self, frame: str) -> None:
        """Send one frame; a closed socket becomes SandboxError."""
        try:
            await self._ws.send(frame)
        except _closed_types() as exc:
            raise errors.SandboxError("the PTY session is closed") from exc

    async def _pump(self, deadline: Optional[float]) -> None:
        """Receive one frame (or the end of the socket) into the session."""
        try:
            text = await asyncio.wait_for(self._ws.recv(), _left(deadline))
        except asyncio.TimeoutError as exc:
            raise errors.SandboxTimeoutError("timed out waiting for the PTY process") from exc
        except _closed_types() as exc:
            self._session.connection_closed(_close_code(exc))
            return
        self._session.feed(text)

    async def write(self, data: Union[bytes, str]) -> None:
        """Send bytes (or UTF-8 text) to the terminal's input."""
        await self._send(PtySession.stdin(data))

    async def read(self, timeout: Optional[float] = None) -> bytes:
        """The next chunk of terminal output; b"" at end of output; SandboxTimeoutError if none comes in time."""
        deadline = _deadline(timeout)
        while not self._session.chunks and not self._session.eof:
            await self._pump(deadline)
        return self._session.take()

    async def resize(self, rows: int, cols: int) -> None:
        """Resize the terminal."""
        await self._send(PtySession.resize(rows, cols))

    async def send_signal(self, name: Union[str, int]) -> None:
        """Send a signal (INT, TERM, KILL, HUP or QUIT) to the process."""
        await self._send(PtySession.signal(name))

    async def wait(self, timeout: Optional[float] = None) -> int:
        """Wait until the process exits and return its exit code; output stays readable with ``read``."""
        deadline = _deadline(timeout)
        while self._session.returncode is None:
            await self._pump(deadline)
        return self._session.returncode

    async def close(self) -> None:
        """Tell the server to end the session (its process tree is killed) and close the socket."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._ws.send(PtySession.close())
        except Exception:
            pass
        await self._ws.close()

    async def __aenter__(self) -> "AsyncPtyProcess":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()
