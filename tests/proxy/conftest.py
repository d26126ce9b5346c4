"""Fixtures: the fake byte-token upstream on a real uvicorn, and a proxy app in-process in front of it."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Callable, Iterator

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from orchard.proxy.app import ProxySettings, create_app
from orchard.proxy.fake_upstream import FakeUpstream, echo_policy

ADMIN = "admin-secret"
UPSTREAM_KEY = "sk-real-upstream-secret"


def serve_in_thread(app: Any) -> tuple[uvicorn.Server, threading.Thread, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the fake upstream did not start"
        time.sleep(0.02)
    return server, thread, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def upstream_server() -> Iterator[tuple[FakeUpstream, str]]:
    fake = FakeUpstream()
    server, thread, url = serve_in_thread(fake)
    yield fake, url
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture
def upstream(upstream_server) -> FakeUpstream:
    """The shared fake upstream, reset: echo policy, token ids on, no requests seen."""
    fake, _ = upstream_server
    fake.policy, fake.token_ids, fake.requests = echo_policy, True, []
    fake.headers = []
    return fake


class Proxy:
    """A proxy app (TestClient) with helpers to open sessions and call admin routes."""

    def __init__(self, client: TestClient, upstream: FakeUpstream):
        self.client, self.upstream = client, upstream

    def open(self, **options: Any) -> dict[str, Any]:
        response = self.admin("POST", "/sessions", json=options)
        assert response.status_code == 201, response.text
        return response.json()

    def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self.client.request(method, path, headers={"Authorization": f"Bearer {ADMIN}"}, **kwargs)


@pytest.fixture
def make_proxy(tmp_path, upstream, upstream_server) -> Iterator[Callable[..., Proxy]]:
    clients: list[TestClient] = []

    def make(**settings: Any) -> Proxy:
        options = {"upstream_url": upstream_server[1], "store_dir": str(tmp_path / "store"), "admin_keys": [ADMIN],
                   "upstream_api_key": UPSTREAM_KEY} | settings
        client = TestClient(create_app(ProxySettings(**options)))
        client.__enter__()
        clients.append(client)
        return Proxy(client, upstream)

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def proxy(make_proxy) -> Proxy:
    return make_proxy()
