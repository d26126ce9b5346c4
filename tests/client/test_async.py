"""The asyncio twin drives the same flows: a sample of each behaviour, over the same fake server."""

import asyncio
import base64

import httpx
import pytest

from orchard import AsyncSandboxClient, JobResult, errors

from .conftest import created, fast, job, reply, sandbox_info

TIMED_OUT = reply(408, {"detail": "not yet"})


async def test_create_waits_and_execs(aclient, server):
    server.on("POST", "/sandboxes", reply(200, created()))
    server.on("GET", "/sandboxes/sb1/wait", TIMED_OUT, reply(200, sandbox_info()))
    server.on("POST", "/sandboxes/sb1/exec", reply(200, job("running", None)))
    server.on("GET", "/jobs/j1/wait", reply(200, job("running", None)), reply(200, job()))
    sandbox = await aclient.create_sandbox("img", poll_interval=0)
    result = await sandbox.exec("make", cwd="/testbed")
    assert isinstance(result, JobResult) and result.succeeded
    post = server.calls("POST", "/sandboxes/sb1/exec")[0]
    assert post.headers["idempotency-key"] and post.headers["x-api-key"] == "key-1"
    assert len(server.calls("GET", "/jobs/j1/wait")) == 2


async def test_errors_and_retries(aclient, server):
    server.on("GET", "/health", reply(503, {"detail": "busy"}, {"Retry-After": "0"}), reply(200, {"status": "ok"}))
    assert (await aclient.health()).status == "ok"
    server.on("POST", "/sandboxes", reply(200, created()))
    server.on("GET", "/sandboxes/sb1/wait", reply(200, sandbox_info(status="failed", message="no such image")))
    server.on("DELETE", "/sandboxes/sb1", reply(200, {"status": "deleted", "sandbox_id": "sb1"}))
    with pytest.raises(errors.SandboxFailedError, match="no such image"):
        await aclient.create_sandbox("img")


async def test_exec_resent_with_the_same_key(aclient, server):
    server.on("GET", "/sandboxes/sb1", reply(200, sandbox_info()))
    server.on("POST", "/sandboxes/sb1/exec", httpx.ReadTimeout("slow"), reply(200, job()))
    await (await aclient.get_sandbox("sb1")).exec("echo")
    keys = [r.headers["idempotency-key"] for r in server.calls("POST", "/sandboxes/sb1/exec")]
    assert len(keys) == 2 and keys[0] == keys[1]


async def test_files_round_trip(aclient, server, tmp_path):
    server.on("GET", "/sandboxes/sb1", reply(200, sandbox_info()))
    server.on("POST", "/sandboxes/sb1/files", reply(200, {"success": True, "path": "/w/a", "size": 3}))
    server.on("GET", "/sandboxes/sb1/files", reply(200, {"path": "/w/a", "content": base64.b64encode(b"abc").decode(),
                                                         "size": 3}))
    sandbox = await aclient.get_sandbox("sb1")
    local = tmp_path / "a"
    local.write_bytes(b"abc")
    await sandbox.upload_file(local, "/w/a")
    assert (await sandbox.download_file("/w/a", tmp_path / "out" / "a")).read_bytes() == b"abc"


async def test_heartbeat_task(aclient, server):
    server.on("GET", "/sandboxes/sb1", reply(200, sandbox_info()))
    server.on("POST", "/sandboxes/sb1/heartbeat", reply(200, {"status": "ok", "sandbox_id": "sb1"}))
    sandbox = await aclient.get_sandbox("sb1")
    await sandbox.start_heartbeat(interval=0.01)
    await asyncio.sleep(0.1)
    await sandbox.stop_heartbeat()
    beats = len(server.calls("POST", "/sandboxes/sb1/heartbeat"))
    await asyncio.sleep(0.05)
    assert beats >= 3 and len(server.calls("POST", "/sandboxes/sb1/heartbeat")) == beats


async def test_context_managers_clean_up(server):
    server.on("POST", "/sandboxes", reply(200, created("sb1", "ready")), reply(200, created("sb2", "ready")))
    server.on("DELETE", "/sandboxes/sb1", reply(200, {"status": "deleted", "sandbox_id": "sb1"}))
    server.on("DELETE", "/sandboxes/sb2", reply(200, {"status": "deleted", "sandbox_id": "sb2"}))
    async with fast(AsyncSandboxClient(base_url="http://t", transport=httpx.MockTransport(server.handler))) as c:
        async with await c.create_sandbox("img"):
            pass
        await c.create_sandbox("img")
        assert c.tracked_sandboxes() == ["sb2"]
    deleted = [r.url.path for r in server.requests if r.method == "DELETE"]
    assert deleted == ["/sandboxes/sb1", "/sandboxes/sb2"] and c.closed


async def test_cleanup_all_runs_concurrently(aclient, server):
    server.on("POST", "/sandboxes", *(reply(200, created(f"sb{i}", "ready")) for i in range(3)))
    for i in range(3):
        server.on("DELETE", f"/sandboxes/sb{i}", reply(200, {"status": "deleted", "sandbox_id": f"sb{i}"}))
    for _ in range(3):
        await aclient.create_sandbox("img")
    assert sorted(await aclient.cleanup_all()) == ["sb0", "sb1", "sb2"]
    assert aclient.tracked_sandboxes() == []
