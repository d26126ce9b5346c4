"""Settings precedence: constructor arguments > SANDBOX_* environment variables > defaults."""

import re

import httpx
import pytest

from orchard import SandboxClient
from orchard.env.protocol import SANDBOX_ID_PATTERN

from .conftest import FakeServer, created, reply


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("SANDBOX_BASE_URL", "SANDBOX_API_KEY", "SANDBOX_PREFIX"):
        monkeypatch.delenv(name, raising=False)


def _create(server: FakeServer, **kwargs) -> httpx.Request:
    server.on("POST", "/sandboxes", reply(200, created(status="ready")))
    with SandboxClient(transport=httpx.MockTransport(server.handler), auto_cleanup=False, **kwargs) as client:
        client.create_sandbox("python:3.11-slim")
    return server.calls("POST", "/sandboxes")[0]


def test_defaults_without_environment(server):
    request = _create(server)
    assert str(request.url) == "http://127.0.0.1:8080/sandboxes"
    assert "x-api-key" not in request.headers
    assert FakeServer.body(request)["sandbox_id"] is None


def test_environment_is_used(server, monkeypatch):
    monkeypatch.setenv("SANDBOX_BASE_URL", "http://env.test:9000/")
    monkeypatch.setenv("SANDBOX_API_KEY", "env-key")
    monkeypatch.setenv("SANDBOX_PREFIX", "Eval")
    request = _create(server)
    assert str(request.url) == "http://env.test:9000/sandboxes"
    assert request.headers["x-api-key"] == "env-key"
    sandbox_id = FakeServer.body(request)["sandbox_id"]
    assert re.fullmatch(r"eval-[0-9a-f]{12}", sandbox_id) and re.match(SANDBOX_ID_PATTERN, sandbox_id)


def test_constructor_beats_environment(server, monkeypatch):
    monkeypatch.setenv("SANDBOX_BASE_URL", "http://env.test:9000")
    monkeypatch.setenv("SANDBOX_API_KEY", "env-key")
    monkeypatch.setenv("SANDBOX_PREFIX", "env")
    request = _create(server, base_url="http://arg.test", api_key="arg-key", prefix="arg")
    assert request.url.host == "arg.test"
    assert request.headers["x-api-key"] == "arg-key"
    assert FakeServer.body(request)["sandbox_id"].startswith("arg-")


def test_explicit_sandbox_id_wins_over_prefix(server):
    server.on("POST", "/sandboxes", reply(200, created("mine", status="ready")))
    with SandboxClient(prefix="pre", transport=httpx.MockTransport(server.handler), auto_cleanup=False) as client:
        client.create_sandbox("img", sandbox_id="mine")
    assert FakeServer.body(server.requests[-1])["sandbox_id"] == "mine"


def test_generated_ids_are_unique(server):
    server.on("POST", "/sandboxes", reply(200, created(status="ready")))
    with SandboxClient(prefix="p", transport=httpx.MockTransport(server.handler), auto_cleanup=False) as client:
        client.create_sandbox("img")
        client.create_sandbox("img")
    ids = [FakeServer.body(r)["sandbox_id"] for r in server.requests]
    assert len(set(ids)) == 2


@pytest.mark.parametrize("prefix", ["has space", "x" * 60, "under_score", "-lead"])
def test_prefix_that_cannot_make_a_dns_label_is_rejected(prefix):
    with pytest.raises(ValueError, match="DNS label"):
        SandboxClient(prefix=prefix, auto_cleanup=False)


def test_timeout_is_the_http_default(server):
    server.on("GET", "/health", reply(200, {"status": "healthy"}))
    with SandboxClient(timeout=7, transport=httpx.MockTransport(server.handler)) as client:
        assert client.health().status == "healthy"
    assert server.requests[0].extensions["timeout"]["read"] == 7
