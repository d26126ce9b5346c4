"""The in-pod agent on its own: token checks, exec semantics, files, terminals, token hand-over and install."""

from __future__ import annotations

import ast
import asyncio
import base64
import os
import stat
import threading
import time
from pathlib import Path

import httpx
import pytest

from orchard.env import agent
from orchard.env.agent import install, server
from orchard.env.backends.base import ExecSpec
from orchard.env.backends.kubernetes_agent_client import Agent, AgentClient

TOKEN = "t0k3n-for-tests"


@pytest.fixture(scope="module")
def agent_url():
    srv = server.serve(0, TOKEN, "127.0.0.1")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def http(agent_url):
    with httpx.Client(base_url=agent_url, headers={agent.TOKEN_HEADER: TOKEN}, timeout=60) as c:
        yield c


def run(http, argv, **kw) -> dict:
    r = http.post(agent.EXEC, json={"argv": argv, "cwd": kw.pop("cwd", "/tmp"), **kw})
    assert r.status_code == 200, r.text
    out = r.json()
    out["stdout"], out["stderr"] = base64.b64decode(out["stdout"]), base64.b64decode(out["stderr"])
    return out


def test_package_imports_only_the_standard_library():
    import sys
    for path in Path(agent.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in sys.stdlib_module_names | {"__future__"}, (path.name, name)


def test_token_is_required(agent_url):
    assert httpx.get(agent_url + agent.HEALTH).status_code == 200          # the probe needs no token
    for headers, code in (({}, 401), ({agent.TOKEN_HEADER: "wrong"}, 403), ({agent.TOKEN_HEADER: ""}, 403)):
        for method, path in (("POST", agent.EXEC), ("GET", agent.FILE), ("GET", agent.LIST), ("POST", agent.PTY),
                             ("GET", agent.INFO), ("POST", agent.PTY_CONTROL + "x/kill")):
            r = httpx.request(method, agent_url + path, headers=headers, json={"argv": ["true"]})
            assert r.status_code == code, (method, path, headers)


def test_exec_argv_env_and_exit_codes(http, monkeypatch):
    monkeypatch.setenv(agent.TOKEN_ENV, "leak-me")
    out = run(http, ["printf", "%s|", "a b", "$HOME", "*"])
    assert (out["exit_code"], out["stdout"], out["error"]) == (0, b"a b|$HOME|*|", None)
    out = run(http, ["bash", "-c", "echo $FOO; echo ${ORCHARD_AGENT_TOKEN:-hidden}; pwd; exit 3"], env={"FOO": "x y"},
              cwd="/usr")
    assert (out["exit_code"], out["stdout"]) == (3, b"x y\nhidden\n/usr\n")
    assert run(http, ["no-such-program-xyz"])["exit_code"] == 127
    missing = run(http, ["pwd"], cwd="/does/not/exist")
    assert "/does/not/exist" in missing["error"]
    assert http.post(agent.EXEC, json={"argv": []}).status_code == 400


def test_exec_timeout_kills_the_whole_group(http, tmp_path):
    pidfile = tmp_path / "bg.pid"
    t = time.monotonic()
    out = run(http, ["bash", "-c", f"echo started; sleep 300 & echo $! > {pidfile}; sleep 300"], timeout=1)
    assert time.monotonic() - t < 15
    assert (out["exit_code"], out["error"], out["stdout"]) == (124, "Execution timed out after 1s", b"started\n")
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def test_exec_output_caps_and_background_children(http):
    out = run(http, ["bash", "-c", "head -c 300000 /dev/zero; echo tail >&2"], output_limit=1000)
    assert len(out["stdout"]) == 1000 and out["stdout_truncated"] and not out["stderr_truncated"]
    assert out["stderr"] == b"tail\n"
    t = time.monotonic()
    out = run(http, ["bash", "-c", "sleep 30 & echo done"])
    assert out["stdout"] == b"done\n" and time.monotonic() - t < 10


def test_files_roundtrip_mode_and_errors(http, tmp_path):
    target = tmp_path / "deep" / "dir" / "f.sh"
    assert http.put(agent.FILE, params={"path": str(target), "mode": "493"}, content=b"\x00bin\xff").status_code == 204
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert http.get(agent.FILE, params={"path": str(target)}).content == b"\x00bin\xff"
    assert http.get(agent.FILE, params={"path": str(tmp_path / "nope")}).status_code == 404
    assert http.get(agent.FILE, params={"path": str(tmp_path)}).status_code == 400
    assert http.get(agent.FILE, params={"path": str(target), "limit": "3"}).status_code == 413
    assert http.get(agent.FILE, params={"path": "relative"}).status_code == 400
    (tmp_path / "file-parent").write_text("x")
    assert http.put(agent.FILE, params={"path": str(tmp_path / "file-parent" / "x")}, content=b"").status_code == 404


def test_listing_sorted_with_kinds(http, tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("12345\n")
    os.symlink("/nowhere", tmp_path / "a-broken")
    os.symlink("b.txt", tmp_path / "c-link")
    entries = http.get(agent.LIST, params={"path": str(tmp_path)}).json()
    assert [(e["name"], e["type"]) for e in entries] == [("a-broken", "symlink"), ("b.txt", "file"),
                                                        ("c-link", "symlink"), ("sub", "directory")]
    assert entries[1]["size"] == 6 and all("T" in e["modified"] for e in entries)
    assert http.get(agent.LIST, params={"path": str(tmp_path / "b.txt")}).status_code == 400
    assert http.get(agent.LIST, params={"path": str(tmp_path / "none")}).status_code == 404


async def test_terminal_echo_exit_code_and_signal(agent_url):
    host, port = agent_url.rsplit("/", 1)[1].split(":")
    client = AgentClient(4)
    target = Agent("t", host, int(port), TOKEN)
    try:
        pty = await client.open_pty(target, ["bash", "--norc", "-i"], "/tmp", {}, 24, 80)
        os.write(pty.master_fd, b"stty -echo; echo $((6*7)); exit 5\n")
        out = await _read_until(pty.master_fd, b"42")
        assert b"42" in out and await asyncio.wait_for(pty.wait(), 20) == 5
        await pty.kill()
        pty = await client.open_pty(target, ["sleep", "100"], "/tmp", {}, 24, 80)
        pty.signal(15)
        assert await asyncio.wait_for(pty.wait(), 20) == -15
        await pty.kill()
        out = await client.exec(target, ExecSpec(["echo", "hi"]), "/tmp", {})
        assert out.stdout == b"hi\n"
    finally:
        await client.close()


async def _read_until(fd: int, marker: bytes) -> bytes:
    loop, out = asyncio.get_running_loop(), b""
    deadline = loop.time() + 20
    while marker not in out and loop.time() < deadline:
        await asyncio.sleep(0.05)
        try:
            out += os.read(fd, 65536)
        except BlockingIOError:
            pass
    return out


def test_token_file_is_read_once(tmp_path, monkeypatch):
    path = tmp_path / "token"
    path.write_text("abc\n")
    monkeypatch.setenv(agent.TOKEN_FILE_ENV, str(path))
    assert server.read_token() == "abc" and not path.exists()
    monkeypatch.delenv(agent.TOKEN_ENV, raising=False)
    with pytest.raises(SystemExit):
        server.read_token()


def test_install_copies_home_and_leaves_a_private_token(tmp_path):
    source = tmp_path / "image-home"
    (source / "lib").mkdir(parents=True)
    (source / "lib" / "x.py").write_text("x = 1\n")
    os.symlink("/usr/bin/python3", source / "python3")
    install.install(str(source), str(tmp_path / "copy"), str(tmp_path), "tok")
    assert (tmp_path / "copy" / "lib" / "x.py").read_text() == "x = 1\n"
    assert os.readlink(tmp_path / "copy" / "python3") == "/usr/bin/python3"
    assert (tmp_path / "token").read_text() == "tok" and stat.S_IMODE((tmp_path / "token").stat().st_mode) == 0o444


def test_workdir_is_workspace_else_home(tmp_path, monkeypatch):
    monkeypatch.chdir("/")
    monkeypatch.setattr(server, "WORKSPACE", str(tmp_path / "workspace"))
    server._enter_workdir()
    assert os.getcwd() == str(tmp_path / "workspace")
    monkeypatch.chdir("/")
    monkeypatch.setattr(server, "WORKSPACE", "/proc/cannot-be-made")       # e.g. an image whose user is not root
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    server._enter_workdir()
    assert os.getcwd() == str(tmp_path / "home")
