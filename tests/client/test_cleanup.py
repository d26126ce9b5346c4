"""Cleanup of tracked sandboxes: context managers, cleanup_all, exit hooks and signals; the heartbeat thread."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from orchard import SandboxClient
from orchard.client import sync

from .conftest import created, fast, reply, sandbox_info

DELETED = reply(200, {"status": "deleted", "sandbox_id": "x"})
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _script_two(server):
    server.on("POST", "/sandboxes", reply(200, created("sb1", "ready")), reply(200, created("sb2", "ready")))
    server.on("DELETE", "/sandboxes/sb1", DELETED)
    server.on("DELETE", "/sandboxes/sb2", DELETED)
    server.on("GET", "/sandboxes/other", reply(200, sandbox_info("other")))


def _deleted(server):
    return sorted(r.url.path.rsplit("/", 1)[1] for r in server.requests if r.method == "DELETE")


def test_client_exit_deletes_only_what_it_created(server):
    _script_two(server)
    with SandboxClient(base_url="http://t", transport=httpx.MockTransport(server.handler)) as client:
        client.create_sandbox("img")
        client.create_sandbox("img")
        client.get_sandbox("other")
    assert _deleted(server) == ["sb1", "sb2"] and client.closed


def test_handle_exit_deletes_its_sandbox(client, server):
    _script_two(server)
    with client.create_sandbox("img") as sandbox:
        assert sandbox.sandbox_id == "sb1"
    assert _deleted(server) == ["sb1"] and client.tracked_sandboxes() == []


def test_cleanup_all_keeps_what_it_could_not_delete(client, server):
    _script_two(server)
    server.scripts[("DELETE", "/sandboxes/sb2")].clear()
    server.on("DELETE", "/sandboxes/sb2", reply(500, {"detail": "boom"}))
    client.create_sandbox("img")
    client.create_sandbox("img")
    assert client.cleanup_all() == ["sb1"]
    assert client.tracked_sandboxes() == ["sb2"]


def test_no_cleanup_when_disabled(server):
    _script_two(server)
    with SandboxClient(base_url="http://t", auto_cleanup=False, transport=httpx.MockTransport(server.handler)) as c:
        c.create_sandbox("img")
    sync.cleanup_live_clients()
    assert _deleted(server) == []


def test_exit_hook_cleans_live_clients_once(server):
    _script_two(server)
    live = fast(SandboxClient(base_url="http://t", transport=httpx.MockTransport(server.handler)))
    live.create_sandbox("img")
    sync.cleanup_live_clients()
    sync.cleanup_live_clients()
    assert _deleted(server) == ["sb1"]
    live.close()
    assert _deleted(server) == ["sb1"]


def test_closed_clients_leave_the_registry(server):
    client = SandboxClient(base_url="http://t", transport=httpx.MockTransport(server.handler))
    assert client in sync._LIVE
    client.close()
    assert client not in sync._LIVE


# ---------------------------------------------------------------- heartbeat
def test_heartbeat_thread_beats_and_stops(client, server):
    server.on("GET", "/sandboxes/sb1", reply(200, sandbox_info()))
    server.on("POST", "/sandboxes/sb1/heartbeat", reply(200, {"status": "ok", "sandbox_id": "sb1"}))
    sandbox = client.get_sandbox("sb1")
    sandbox.start_heartbeat(interval=0.02)
    time.sleep(0.2)
    sandbox.stop_heartbeat()
    beats = len(server.calls("POST", "/sandboxes/sb1/heartbeat"))
    time.sleep(0.1)
    assert beats >= 3 and len(server.calls("POST", "/sandboxes/sb1/heartbeat")) == beats


def test_heartbeat_stops_when_the_sandbox_is_gone(client, server):
    server.on("GET", "/sandboxes/sb1", reply(200, sandbox_info()))
    server.on("POST", "/sandboxes/sb1/heartbeat", reply(404, {"detail": "Sandbox sb1 not found"}))
    sandbox = client.get_sandbox("sb1")
    sandbox.start_heartbeat(interval=0.01)
    thread = sandbox._heartbeat[0]
    thread.join(timeout=2)
    assert not thread.is_alive() and len(server.calls("POST", "/sandboxes/sb1/heartbeat")) == 1


# ---------------------------------------------------------------- real process exit (a stdlib fake server)
class _Recorder(BaseHTTPRequestHandler):
    log: list = []

    def _answer(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.log.append(("POST", self.path))
        self._answer(created("sbx", "ready"))

    def do_DELETE(self):
        self.log.append(("DELETE", self.path))
        self._answer({"status": "deleted", "sandbox_id": "sbx"})

    def log_message(self, *args):
        pass


@pytest.fixture
def http_server():
    _Recorder.log = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", _Recorder.log
    httpd.shutdown()
    httpd.server_close()


def _child(url: str, tail: str, head: str = "") -> subprocess.CompletedProcess:
    """Run a Python child that creates one sandbox on ``url`` and then runs ``tail``."""
    code = textwrap.dedent(head) + textwrap.dedent(f"""
        import os, signal, sys, time
        from orchard import SandboxClient
        client = SandboxClient(base_url={url!r})
        client.create_sandbox("img")
    """) + textwrap.dedent(tail)
    env = {**os.environ, "PYTHONPATH": SRC, "NO_PROXY": "*", "no_proxy": "*"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_sandboxes_are_deleted_at_interpreter_exit(http_server):
    url, log = http_server
    done = _child(url, "print('bye')")
    assert done.returncode == 0, done.stderr
    assert ("DELETE", "/sandboxes/sbx") in log


def test_sigterm_cleans_up_then_dies_by_default(http_server):
    url, log = http_server
    done = _child(url, "os.kill(os.getpid(), signal.SIGTERM); time.sleep(5); print('survived')")
    assert done.returncode == -signal.SIGTERM and "survived" not in done.stdout
    assert ("DELETE", "/sandboxes/sbx") in log


def test_sigterm_chains_the_previous_handler(http_server):
    url, log = http_server
    head = "import signal\nsignal.signal(signal.SIGTERM, lambda s, f: print('mine', flush=True))\n"
    done = _child(url, "os.kill(os.getpid(), signal.SIGTERM); time.sleep(0.2); print('after')", head)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["mine", "after"]
    assert log.count(("DELETE", "/sandboxes/sbx")) == 1


def test_sigint_raises_keyboard_interrupt_after_cleanup(http_server):
    url, log = http_server
    done = _child(url, """
        try:
            os.kill(os.getpid(), signal.SIGINT); time.sleep(5)
        except KeyboardInterrupt:
            print('interrupted')
    """)
    assert done.returncode == 0 and "interrupted" in done.stdout, done.stderr
    assert log.count(("DELETE", "/sandboxes/sbx")) == 1


def test_an_ignored_signal_stays_ignored(http_server):
    url, log = http_server
    head = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    done = _child(url, "os.kill(os.getpid(), signal.SIGTERM); time.sleep(0.2); print('alive')", head)
    assert done.returncode == 0 and "alive" in done.stdout, done.stderr
    assert log.count(("DELETE", "/sandboxes/sbx")) == 1   # at exit, not on the ignored signal


def test_async_client_sandboxes_are_deleted_at_exit(http_server):
    url, log = http_server
    code = textwrap.dedent(f"""
        import asyncio
        from orchard import AsyncSandboxClient

        async def main():
            client = AsyncSandboxClient(base_url={url!r})
            await client.create_sandbox("img")
            return client     # never closed: the exit hook must clean up without an event loop

        kept = asyncio.run(main())
    """)
    env = {**os.environ, "PYTHONPATH": SRC, "NO_PROXY": "*", "no_proxy": "*"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert log.count(("DELETE", "/sandboxes/sbx")) == 1
