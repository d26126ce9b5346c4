"""Retries: 503 + Retry-After, connection errors, read timeouts only where a resend is safe."""

import time

import httpx
import pytest

from orchard import errors
from orchard.errors import ServiceUnreachableError
from orchard.client.base import HttpReply, HttpRequest, RetryPolicy, parse_retry_after

from .conftest import job, reply, sandbox_info


def overloaded(after: str = "0") -> httpx.Response:
    return reply(503, {"detail": "admission queue full"}, {"Retry-After": after})


def test_503_is_retried_then_succeeds(client, server):
    server.on("GET", "/health", overloaded(), overloaded(), reply(200, {"status": "healthy"}))
    assert client.health().status == "healthy"
    assert len(server.requests) == 3


def test_503_gives_up_after_three_attempts(client, server):
    server.on("POST", "/sandboxes", overloaded("0"))
    with pytest.raises(errors.OverloadedError) as info:
        client.create_sandbox("img")
    assert len(server.requests) == 3 and info.value.retry_after == 0


def test_retry_after_is_honoured(client, server):
    server.on("GET", "/health", overloaded("0.3"), reply(200, {"status": "healthy"}))
    start = time.monotonic()
    client.health()
    assert time.monotonic() - start >= 0.3


def test_connection_errors_are_retried(client, server):
    server.on("POST", "/sandboxes", httpx.ConnectError("refused"),
              reply(200, {"sandbox_id": "sb1", "namespace": "n", "image": "i", "block_network": True,
                          "status": "ready"}))
    assert client.create_sandbox("img").sandbox_id == "sb1"
    assert len(server.requests) == 2


def test_read_timeout_on_create_is_not_retried(client, server):
    server.on("POST", "/sandboxes", httpx.ReadTimeout("slow"))
    with pytest.raises(ServiceUnreachableError) as caught:
        client.create_sandbox("img")
    assert isinstance(caught.value.__cause__, httpx.ReadTimeout)
    assert len(server.requests) == 1


def test_a_service_that_stays_unreachable_raises_a_typed_error(client, server):
    server.on("GET", "/health", *[httpx.ConnectError("refused")] * 3)
    with pytest.raises(ServiceUnreachableError, match="GET /health") as caught:
        client.health()
    assert isinstance(caught.value, ConnectionError) and isinstance(caught.value.__cause__, httpx.ConnectError)
    assert len(server.requests) == 3


def test_read_timeout_on_get_is_retried(client, server):
    server.on("GET", "/sandboxes/sb1", httpx.ReadTimeout("slow"), reply(200, sandbox_info()))
    client.get_sandbox("sb1")
    assert len(server.requests) == 2


def test_exec_is_resent_only_with_the_same_key(client, server):
    server.on("GET", "/sandboxes/sb1", reply(200, sandbox_info()))
    server.on("POST", "/sandboxes/sb1/exec", httpx.ReadTimeout("slow"), httpx.RemoteProtocolError("reset"),
              reply(200, job()))
    assert client.get_sandbox("sb1").exec("echo once").succeeded
    posts = server.calls("POST", "/sandboxes/sb1/exec")
    assert len(posts) == 3 and len({r.headers["idempotency-key"] for r in posts}) == 1


def test_exec_503_is_resent_with_the_same_key(client, server):
    server.on("GET", "/sandboxes/sb1", reply(200, sandbox_info()))
    server.on("POST", "/sandboxes/sb1/exec", overloaded(), reply(200, job()))
    client.get_sandbox("sb1").exec("echo once")
    posts = server.calls("POST", "/sandboxes/sb1/exec")
    assert len(posts) == 2 and posts[0].headers["idempotency-key"] == posts[1].headers["idempotency-key"]


def test_exec_gives_up_after_three_attempts(client, server):
    server.on("GET", "/sandboxes/sb1", reply(200, sandbox_info()))
    server.on("POST", "/sandboxes/sb1/exec", httpx.ReadTimeout("slow"))
    with pytest.raises(ServiceUnreachableError):
        client.get_sandbox("sb1").exec("echo once")
    assert len(server.calls("POST", "/sandboxes/sb1/exec")) == 3


def test_apply_patch_is_never_resent_after_a_read_timeout(client, server):
    server.on("GET", "/sandboxes/sb1", reply(200, sandbox_info()))
    server.on("POST", "/sandboxes/sb1/apply_patch", httpx.ReadTimeout("slow"))
    with pytest.raises(ServiceUnreachableError):
        client.get_sandbox("sb1").apply_patch("diff")
    assert len(server.calls("POST", "/sandboxes/sb1/apply_patch")) == 1


def test_other_errors_are_not_retried(client, server):
    server.on("GET", "/health", reply(500, {"detail": "boom"}))
    with pytest.raises(errors.ServerError):
        client.health()
    assert len(server.requests) == 1


# ---------------------------------------------------------------- the policy itself (pure)
def test_backoff_doubles_with_jitter():
    policy = RetryPolicy()
    for attempt, base in ((1, 1.0), (2, 2.0), (3, 4.0)):
        assert base <= policy.backoff(attempt) <= base * 1.1


def test_policy_decisions():
    policy = RetryPolicy()
    get, post = HttpRequest("GET", "/x"), HttpRequest("POST", "/x")
    busy = HttpReply(503, {"retry-after": "5"}, {"detail": "busy"})
    assert policy.after_reply(busy, post, 1) == 5.0
    assert policy.after_reply(busy, post, 3) is None
    assert policy.after_reply(HttpReply(503, {}, None), post, 1) >= 1.0
    assert policy.after_reply(HttpReply(500, {}, None), get, 1) is None
    assert policy.after_error(httpx.ReadTimeout("t"), get, 1) is not None
    assert policy.after_error(httpx.ReadTimeout("t"), post, 1) is None
    assert policy.after_error(httpx.ConnectError("c"), post, 1) is not None
    assert policy.after_error(httpx.ConnectError("c"), HttpRequest("GET", "/x", attempts=1), 1) is None
    assert policy.after_error(ValueError("v"), get, 1) is None


def test_retry_after_forms():
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
