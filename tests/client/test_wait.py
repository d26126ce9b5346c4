"""Waiting: sandbox readiness through /wait (with its fallbacks) and jobs through /jobs/{id}/wait."""

import pytest

from orchard import JobResult, errors
from orchard.env.protocol import Job

from .conftest import FakeServer, created, job, reply, sandbox_info

TIMED_OUT = reply(408, {"detail": "Sandbox sb1 did not become ready within 60s"})


def test_create_waits_through_408s(client, server):
    server.on("POST", "/sandboxes", reply(200, created()))
    server.on("GET", "/sandboxes/sb1/wait", TIMED_OUT, TIMED_OUT, reply(200, sandbox_info()))
    sandbox = client.create_sandbox("img", poll_interval=0)
    waits = server.calls("GET", "/sandboxes/sb1/wait")
    assert sandbox.sandbox_id == "sb1" and len(waits) == 3
    assert all(r.url.params["timeout"] == "60" for r in waits)
    assert all(r.extensions["timeout"]["read"] >= 60 + 30 for r in waits)


def test_wait_asks_for_no_more_than_what_is_left(client, server):
    server.on("POST", "/sandboxes", reply(200, created()))
    server.on("GET", "/sandboxes/sb1/wait", reply(200, sandbox_info()))
    client.create_sandbox("img", timeout=20)
    assert server.calls("GET", "/sandboxes/sb1/wait")[0].url.params["timeout"] == "20"


def test_wait_not_ready_in_time(client, server):
    server.on("POST", "/sandboxes", reply(200, created()))
    server.on("GET", "/sandboxes/sb1/wait", TIMED_OUT)
    server.on("DELETE", "/sandboxes/sb1", reply(200, {"status": "deleted", "sandbox_id": "sb1"}))
    with pytest.raises(errors.SandboxTimeoutError) as info:
        client.create_sandbox("img", timeout=0.3, poll_interval=0.05)
    assert isinstance(info.value, TimeoutError)
    assert server.calls("DELETE", "/sandboxes/sb1") and client.tracked_sandboxes() == []


def test_failed_sandbox_raises_with_its_message(client, server):
    server.on("POST", "/sandboxes", reply(200, created()))
    server.on("GET", "/sandboxes/sb1/wait", reply(200, sandbox_info(status="failed", message="image not found")))
    server.on("DELETE", "/sandboxes/sb1", reply(200, {"status": "deleted", "sandbox_id": "sb1"}))
    with pytest.raises(errors.SandboxFailedError, match="image not found"):
        client.create_sandbox("nope:latest")
    assert len(server.calls("DELETE", "/sandboxes/sb1")) == 1


def test_failed_sandbox_is_kept_without_auto_cleanup(make_client, server):
    client = make_client(auto_cleanup=False)
    server.on("POST", "/sandboxes", reply(200, created()))
    server.on("GET", "/sandboxes/sb1/wait", reply(200, sandbox_info(status="failed", message="pull failed")))
    with pytest.raises(errors.SandboxFailedError):
        client.create_sandbox("img")
    assert not server.calls("DELETE", "/sandboxes/sb1")


def test_missing_wait_route_falls_back_to_polling(client, server):
    server.on("POST", "/sandboxes", reply(200, created()))
    server.on("GET", "/sandboxes/sb1", reply(200, sandbox_info(status="pending")), reply(200, sandbox_info()))
    sandbox = client.create_sandbox("img", poll_interval=0.01)   # /wait is unscripted: the router's 404
    assert sandbox.sandbox_id == "sb1" and len(server.calls("GET", "/sandboxes/sb1")) == 2


def test_wait_404_for_the_sandbox_means_gone(client, server):
    server.on("POST", "/sandboxes", reply(200, created()))
    server.on("GET", "/sandboxes/sb1/wait", reply(404, {"detail": "Sandbox sb1 not found"}))
    with pytest.raises(errors.SandboxNotFoundError, match="sb1 not found"):
        client.create_sandbox("img")
    assert not server.calls("GET", "/sandboxes/sb1")


def test_no_wait_when_asked(client, server):
    server.on("POST", "/sandboxes", reply(200, created()))
    client.create_sandbox("img", wait_ready=False)
    assert len(server.requests) == 1


def test_wait_ready_on_a_handle(client, server):
    server.on("GET", "/sandboxes/sb1", reply(200, sandbox_info(status="pending")))
    server.on("GET", "/sandboxes/sb1/wait", reply(200, sandbox_info(status="pending")), reply(200, sandbox_info()))
    assert client.get_sandbox("sb1").wait_ready(timeout=5, poll_interval=0).ready


# ---------------------------------------------------------------- jobs
def _sandbox(client, server):
    server.on("GET", "/sandboxes/sb1", reply(200, sandbox_info()))
    return client.get_sandbox("sb1")


def test_running_reply_is_never_final(client, server):
    server.on("POST", "/sandboxes/sb1/exec", reply(200, job("running", None)))
    server.on("GET", "/jobs/j1/wait", reply(200, job("running", None)),
              reply(408, {"detail": "still running"}), reply(200, job("failed", 3, stdout="partial")))
    result = _sandbox(client, server).exec("make test")
    waits = server.calls("GET", "/jobs/j1/wait")
    assert isinstance(result, JobResult) and len(waits) == 3
    assert result.failed and result.exit_code == 3 and result.stdout == "partial" and result.is_complete
    assert all(r.url.params["timeout"] == "60" for r in waits)
    assert all(r.extensions["timeout"]["read"] >= 90 for r in waits)


def test_queued_only_reply_is_followed(client, server):
    server.on("POST", "/sandboxes/sb1/exec", reply(200, {"job_id": "j1", "status": "queued"}))
    server.on("GET", "/jobs/j1/wait", reply(200, job()))
    assert _sandbox(client, server).exec("true").succeeded


def test_exec_gives_up_after_timeout_plus_grace(client, server):
    client._core._exec_grace = 0.2
    server.on("POST", "/sandboxes/sb1/exec", reply(200, job("running", None)))
    server.on("GET", "/jobs/j1/wait", reply(200, job("running", None)))
    with pytest.raises(errors.SandboxTimeoutError, match="j1"):
        _sandbox(client, server).exec("sleep 100", timeout=0.1)
    assert server.calls("GET", "/jobs/j1/wait")[0].url.params["timeout"] == "1"


def test_exec_wait_bounded_by_timeout(client, server):
    server.on("POST", "/sandboxes/sb1/exec", reply(200, job("running", None)))
    server.on("GET", "/jobs/j1/wait", reply(200, job()))
    _sandbox(client, server).exec("sleep 5", timeout=10)
    post = server.calls("POST", "/sandboxes/sb1/exec")[0]
    assert server.calls("GET", "/jobs/j1/wait")[0].url.params["timeout"] == "40"   # 10 s + 30 s grace
    assert post.extensions["timeout"]["read"] >= 10 + 30


def test_missing_job_wait_route_falls_back_to_polling(client, server):
    server.on("POST", "/sandboxes/sb1/exec", reply(200, job("running", None)))
    server.on("GET", "/jobs/j1", reply(200, job("running", None)), reply(200, job()))
    assert _sandbox(client, server).exec("true").succeeded
    assert len(server.calls("GET", "/jobs/j1")) == 2


def test_unknown_job_raises_not_found(client, server):
    server.on("POST", "/sandboxes/sb1/exec", reply(200, job("running", None)))
    server.on("GET", "/jobs/j1/wait", reply(404, {"detail": "Job j1 not found"}))
    with pytest.raises(errors.NotFoundError, match="Job j1"):
        _sandbox(client, server).exec("true")


def test_job_result_properties():
    done = JobResult.from_job(Job.model_validate(job("failed", 124, error="Execution timed out after 5s")))
    assert done.failed and not done.succeeded and done.is_complete and done.error.startswith("Execution")
    running = JobResult.from_job(Job.model_validate(job("running", None)))
    assert not running.is_complete and not running.succeeded and not running.failed
    assert JobResult.from_job(Job.model_validate(job())).succeeded


def test_no_client_deadline_when_timeout_is_none(client, server):
    server.on("POST", "/sandboxes", reply(200, created()))
    server.on("GET", "/sandboxes/sb1/wait", TIMED_OUT, reply(200, sandbox_info()))
    client.create_sandbox("img", timeout=None, poll_interval=0)
    assert FakeServer.body(server.calls("POST", "/sandboxes")[0])["timeout"] is None
    assert [r.url.params["timeout"] for r in server.calls("GET", "/sandboxes/sb1/wait")] == ["60", "60"]
