"""PTY processes against a scripted WebSocket server that speaks env-api.md's PTY frames."""

import base64
import json
import sys
import threading

import httpx
import pytest

from orchard import AsyncSandboxClient, errors
from orchard.client.pty import AsyncPtyProcess, PtyProcess
from orchard.env.protocol import PtyInit

from .conftest import reply, sandbox_info

websockets_server = pytest.importorskip("websockets.sync.server")
EXIT_CODES = {"INT": -2, "TERM": -15, "KILL": -9}


def _out(ws, data: bytes) -> None:
    ws.send(json.dumps({"type": "stdout", "data": base64.b64encode(data).decode()}))


def _session(ws, seen: list) -> None:
    """One scripted PTY session: echo stdin, report resizes, exit on a signal."""
    init = json.loads(ws.recv())
    seen.append({"path": ws.request.path, "subprotocol": ws.subprotocol, "init": init})
    if init["cmd"][-1] == "bad":
        ws.send(json.dumps({"type": "error", "message": "cwd does not exist"}))
        ws.close(4400)
        return
    if init["cmd"][-1] == "gone":
        ws.send(json.dumps({"type": "error", "message": "Sandbox sb1 not found", "error": "SandboxNotFoundError"}))
        ws.close(4400)
        return
    ws.send(json.dumps({"type": "ready", "pid": 42}))
    for text in ws:
        frame = json.loads(text)
        seen.append(frame)
        if frame["type"] == "stdin":
            _out(ws, base64.b64decode(frame["data"]))
        elif frame["type"] == "resize":
            _out(ws, f"{frame['rows']}x{frame['cols']}".encode())
        elif frame["type"] == "signal":
            _out(ws, b"bye")
            ws.send(json.dumps({"type": "exit", "code": EXIT_CODES[frame["sig"]]}))
            ws.close()
            return
        elif frame["type"] == "close":
            return


def _check_auth(connection, request):
    if "api_key.key-1" not in (request.headers.get("Sec-WebSocket-Protocol") or ""):
        return connection.respond(401, json.dumps({"detail": "Missing API key. Please provide X-API-Key header."}))
    if "/gone/" in request.path:
        return connection.respond(404, json.dumps({"detail": "Sandbox gone not found"}))
    return None


def _pick(connection, offered):
    return next((s for s in offered if s.startswith("api_key.")), None)


@pytest.fixture
def pty_server():
    seen: list = []
    server = websockets_server.serve(lambda ws: _session(ws, seen), "127.0.0.1", 0,
                                     process_request=_check_auth, select_subprotocol=_pick)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.socket.getsockname()[1]}", seen
    server.shutdown()


@pytest.fixture
def pty_sandbox(pty_server, make_client, server):
    url, seen = pty_server
    server.on("GET", "/sandboxes/sb1", reply(200, sandbox_info()))
    return make_client(base_url=url).get_sandbox("sb1"), seen


def test_interactive_session(pty_sandbox):
    sandbox, seen = pty_sandbox
    with sandbox.exec("cat", cwd="/testbed", env={"A": "1"}, pty=True) as proc:
        assert isinstance(proc, PtyProcess) and proc.pid == 42
        proc.write("hello")
        assert proc.read(timeout=5) == b"hello"
        proc.resize(40, 120)
        assert proc.read(timeout=5) == b"40x120"
        proc.send_signal("SIGINT")
        assert proc.wait(timeout=5) == -2 and proc.returncode == -2
        assert proc.read(timeout=5) == b"bye" and proc.read() == b""
    first = seen[0]
    assert first["path"] == "/sandboxes/sb1/exec/pty" and first["subprotocol"] == "api_key.key-1"
    assert first["init"] == {"type": "init", "cmd": ["bash", "-c", "cat"], "env": {"A": "1"}, "cwd": "/testbed",
                             "rows": 24, "cols": 80, "login_shell": False}


def test_argv_command_and_close(pty_sandbox):
    sandbox, seen = pty_sandbox
    proc = sandbox.exec(["python3", "-i"], pty=True)
    proc.write(b"\x03")
    assert proc.read(timeout=5) == b"\x03"
    proc.close()
    proc.close()
    assert seen[0]["init"]["cmd"] == ["python3", "-i"]


def test_read_times_out(pty_sandbox):
    sandbox, _ = pty_sandbox
    with sandbox.exec("cat", pty=True) as proc:
        with pytest.raises(errors.SandboxTimeoutError):
            proc.read(timeout=0.1)


def test_error_frame_raises_request_error(pty_sandbox):
    sandbox, _ = pty_sandbox
    with pytest.raises(errors.RequestError, match="cwd does not exist"):
        sandbox.exec("bad", pty=True)


def test_error_frame_names_its_class(pty_sandbox):
    sandbox, _ = pty_sandbox
    with pytest.raises(errors.SandboxNotFoundError, match="sb1 not found"):
        sandbox.exec("gone", pty=True)


def test_bad_signal_name_is_refused(pty_sandbox):
    sandbox, _ = pty_sandbox
    with sandbox.exec("cat", pty=True) as proc:
        with pytest.raises(errors.RequestError):
            proc.send_signal("USR1")


def test_refused_handshake_is_typed(pty_server, make_client, server):
    url, _ = pty_server
    server.on("GET", "/sandboxes/sb1", reply(200, sandbox_info()))
    server.on("GET", "/sandboxes/gone", reply(200, sandbox_info("gone")))
    with pytest.raises(errors.AuthError, match="Missing API key"):
        make_client(base_url=url, api_key="wrong").get_sandbox("sb1").exec("cat", pty=True)
    with pytest.raises(errors.SandboxNotFoundError):
        make_client(base_url=url).get_sandbox("gone").exec("cat", pty=True)


async def test_async_session(pty_server):
    url, seen = pty_server
    init_url = url.replace("http", "ws") + "/sandboxes/sb1/exec/pty"
    async with await AsyncPtyProcess.open(init_url, ["api_key.key-1"], PtyInit(cmd=["bash"])) as proc:
        await proc.write("ping")
        assert await proc.read(timeout=5) == b"ping"
        await proc.send_signal("TERM")
        assert await proc.wait(timeout=5) == -15
        assert await proc.read() == b"bye" and await proc.read() == b""


async def test_async_exec_pty(pty_server, server):
    url, _ = pty_server
    server.on("GET", "/sandboxes/sb1", reply(200, sandbox_info()))
    async with AsyncSandboxClient(base_url=url, api_key="key-1", transport=httpx.MockTransport(server.handler)) as c:
        sandbox = await c.get_sandbox("sb1")
        proc = await sandbox.exec("cat", pty=True)
        await proc.resize(10, 20)
        assert await proc.read(timeout=5) == b"10x20"
        await proc.close()


def test_missing_websockets_names_the_extra(pty_sandbox, monkeypatch):
    sandbox, _ = pty_sandbox
    for name in ("websockets", "websockets.sync", "websockets.sync.client"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=r"pip install 'orchard\[pty\]'"):
        sandbox.exec("cat", pty=True)
