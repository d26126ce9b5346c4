"""The requests the SDK sends: routes, bodies, headers and query strings, and how replies are parsed."""

import base64
import os
import re

from orchard import JobResult
from orchard.env import protocol as p

from .conftest import FakeServer, created, job, reply, sandbox_info


def test_create_body_and_extras(client, server):
    server.on("POST", "/sandboxes", reply(200, created(status="ready")))
    sandbox = client.create_sandbox("python:3.11-slim", block_network=False, cpu="2", memory="4Gi", timeout=120,
                                    ttl_seconds=600, model_endpoint={"port": 8000, "target": "host:9000"},
                                    future_knob="x")
    body = FakeServer.body(server.requests[0])
    assert body == {"image": "python:3.11-slim", "block_network": False, "sandbox_id": None, "cpu": "2",
                    "memory": "4Gi", "timeout": 120, "ttl_seconds": 600,
                    "model_endpoint": {"port": 8000, "target": "host:9000"}, "future_knob": "x"}
    assert server.requests[0].headers["x-api-key"] == "key-1"
    assert sandbox.sandbox_id == "sb1" and client.tracked_sandboxes() == ["sb1"]
    assert len(server.requests) == 1  # ready at once: no wait


def test_create_defaults(client, server):
    server.on("POST", "/sandboxes", reply(200, created(status="ready")))
    client.create_sandbox("img")
    assert FakeServer.body(server.requests[0]) == {"image": "img", "block_network": True, "sandbox_id": None,
                                                   "cpu": None, "memory": None, "timeout": 3600}


def test_exec_body_and_idempotency_key(client, server):
    server.on("POST", "/sandboxes/sb1/exec", reply(200, job()))
    sandbox = client_sandbox(client, server)
    result = sandbox.exec("pytest -q", timeout=600, cwd="/testbed", env={"CI": "1"}, login_shell=True)
    request = server.calls("POST", "/sandboxes/sb1/exec")[0]
    assert FakeServer.body(request) == {"command": "pytest -q", "timeout_seconds": 600, "cwd": "/testbed",
                                        "env": {"CI": "1"}, "login_shell": True, "wait": True}
    assert re.fullmatch(r"[0-9a-f]{32}", request.headers["idempotency-key"])
    assert isinstance(result, JobResult) and result.succeeded and result.stdout == "out"


def test_exec_argv_and_fractional_timeout(client, server):
    server.on("POST", "/sandboxes/sb1/exec", reply(200, job()))
    client_sandbox(client, server).exec(["python", "-c", "print('a b')"], timeout=1.5)
    body = FakeServer.body(server.calls("POST", "/sandboxes/sb1/exec")[0])
    assert body["command"] == ["python", "-c", "print('a b')"] and body["timeout_seconds"] == 2


def test_each_exec_gets_its_own_key(client, server):
    server.on("POST", "/sandboxes/sb1/exec", reply(200, job()))
    sandbox = client_sandbox(client, server)
    sandbox.exec("a")
    sandbox.exec("b")
    keys = {r.headers["idempotency-key"] for r in server.calls("POST", "/sandboxes/sb1/exec")}
    assert len(keys) == 2


def test_apply_patch(client, server):
    server.on("POST", "/sandboxes/sb1/apply_patch", reply(200, {"success": True, "stdout": "", "stderr": "",
                                                                "exit_code": 0, "error": None}))
    result = client_sandbox(client, server).apply_patch("diff --git a/x b/x\n", cwd="/testbed")
    body = FakeServer.body(server.calls("POST", "/sandboxes/sb1/apply_patch")[0])
    assert body == {"patch": "diff --git a/x b/x\n", "timeout_seconds": 30, "cwd": "/testbed"}
    assert isinstance(result, p.ApplyPatchResponse) and result.success


def test_upload_content_and_file(client, server, tmp_path):
    server.on("POST", "/sandboxes/sb1/files", reply(200, {"success": True, "path": "/w/a.py", "size": 8}))
    sandbox = client_sandbox(client, server)
    sandbox.upload_content("print(1)", "/w/a.py")
    script = tmp_path / "run.sh"
    script.write_bytes(b"\x00\xffbin")
    os.chmod(script, 0o755)
    sandbox.upload_file(script, "/w/run.sh")
    text, binary = (FakeServer.body(r) for r in server.calls("POST", "/sandboxes/sb1/files"))
    assert text == {"path": "/w/a.py", "content": base64.b64encode(b"print(1)").decode(), "mode": None}
    assert binary == {"path": "/w/run.sh", "content": base64.b64encode(b"\x00\xffbin").decode(), "mode": 0o755}


def test_download_and_list(client, server, tmp_path):
    data = bytes(range(256))
    server.on("GET", "/sandboxes/sb1/files", reply(200, {"path": "/w/f", "content": base64.b64encode(data).decode(),
                                                         "size": 256}))
    server.on("GET", "/sandboxes/sb1/files/list", reply(200, {"path": "/w", "files": [
        {"name": "f", "type": "file", "size": 256, "modified": "2026-01-01T00:00:00Z"}]}))
    sandbox = client_sandbox(client, server)
    assert sandbox.download_content("/w/f") == data
    target = sandbox.download_file("/w/f", tmp_path / "deep" / "f")
    assert target.read_bytes() == data
    entries = sandbox.list_files("/w")
    assert [(e.name, e.type) for e in entries] == [("f", "file")]
    assert server.calls("GET", "/sandboxes/sb1/files")[0].url.params["path"] == "/w/f"
    assert server.calls("GET", "/sandboxes/sb1/files/list")[0].url.params["path"] == "/w"


def test_jobs_heartbeat_snapshot_info(client, server):
    server.on("GET", "/jobs/j1", reply(200, job("running", None)))
    server.on("POST", "/sandboxes/sb1/heartbeat", reply(200, {"status": "ok", "sandbox_id": "sb1"}))
    server.on("POST", "/sandboxes/sb1/snapshot", reply(200, {"image": "task:ready", "sandbox_id": "sb1"}))
    sandbox = client_sandbox(client, server)
    assert sandbox.get_job("j1").status == "running"
    assert sandbox.heartbeat().status == "ok"
    assert sandbox.snapshot("task:ready").image == "task:ready"
    assert FakeServer.body(server.calls("POST", "/sandboxes/sb1/snapshot")[0]) == {"image": "task:ready"}
    assert sandbox.info().status == "ready"


def test_service_routes(client, server):
    server.on("GET", "/health", reply(200, {"status": "healthy"}))
    server.on("GET", "/sandboxes", reply(200, {"sandboxes": [sandbox_info()]}))
    capacity = {"cpu": 8, "memory_bytes": 1 << 30}
    server.on("GET", "/resources", reply(200, {"status": "ok", "total_capacity": capacity,
                                               "total_allocatable": capacity, "total_requested": capacity,
                                               "available": capacity, "sandbox_count": 1}))
    assert client.health().status == "healthy"
    assert [s.sandbox_id for s in client.list_sandboxes(status="ready")] == ["sb1"]
    assert server.calls("GET", "/sandboxes")[0].url.params["status"] == "ready"
    assert client.resources().sandbox_count == 1


def test_odd_ids_are_quoted_in_the_path(client, server):
    client.delete_sandbox("a/../b")
    assert server.requests[0].url.raw_path == b"/sandboxes/a%2F..%2Fb"


def test_delete_reply(client, server):
    server.on("DELETE", "/sandboxes/sb1", reply(200, {"status": "deleted", "sandbox_id": "sb1"}))
    assert client.delete_sandbox("sb1").status == "deleted"


def client_sandbox(client, server):
    """A handle on sb1 through get_sandbox (which checks that it exists)."""
    server.on("GET", "/sandboxes/sb1", reply(200, sandbox_info()))
    return client.get_sandbox("sb1")
