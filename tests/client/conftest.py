"""A scripted fake Orchard Env service behind ``httpx.MockTransport``, and clients wired to it."""

from __future__ import annotations

import json
from collections import defaultdict, deque
from typing import Any, Callable, Union

import httpx
import pytest

from orchard import AsyncSandboxClient, SandboxClient

BASE = "http://orchard.test"
Reply = Union[httpx.Response, Exception, Callable[[httpx.Request], Any]]


def reply(status: int = 200, body: Any = None, headers: dict | None = None) -> httpx.Response:
    """A JSON reply."""
    return httpx.Response(status, json=body if body is not None else {}, headers=headers)


def sandbox_info(sandbox_id: str = "sb1", status: str = "ready", message: str | None = None) -> dict:
    """A SandboxInfo body."""
    return {"sandbox_id": sandbox_id, "namespace": "orchard", "image": "python:3.11-slim", "created_at": 1.0,
            "ready": status == "ready", "status": status, "status_message": message}


def created(sandbox_id: str = "sb1", status: str = "pending") -> dict:
    """A CreateSandboxResponse body."""
    return {"sandbox_id": sandbox_id, "namespace": "orchard", "image": "python:3.11-slim",
            "block_network": True, "status": status}


def job(status: str = "succeeded", exit_code: int | None = 0, job_id: str = "j1", **more: Any) -> dict:
    """A Job body."""
    body = {"job_id": job_id, "sandbox_id": "sb1", "command": "true", "status": status, "stdout": "out",
            "stderr": "", "exit_code": exit_code, "created_at": 1.0, "started_at": 2.0,
            "completed_at": 3.0 if status in ("succeeded", "failed") else None, "error": None}
    return {**body, **more}


class FakeServer:
    """Replies come from per-route scripts (the last reply of a script repeats); unknown routes are 404."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.scripts: dict[tuple[str, str], deque] = defaultdict(deque)

    def on(self, method: str, path: str, *replies: Reply) -> "FakeServer":
        """Script the replies to ``method path`` in order."""
        self.scripts[(method, path)].extend(replies)
        return self

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        script = self.scripts.get((request.method, request.url.path))
        if not script:
            return reply(404, {"detail": "Not Found"})
        step = script.popleft() if len(script) > 1 else script[0]
        if isinstance(step, Exception):
            raise step
        return step(request) if callable(step) else step

    def calls(self, method: str, path: str) -> list[httpx.Request]:
        """The requests received for one route."""
        return [r for r in self.requests if r.method == method and r.url.path == path]

    @staticmethod
    def body(request: httpx.Request) -> Any:
        """The JSON body of a request."""
        return json.loads(request.content)


def fast(client: Any) -> Any:
    """Make retries and re-polls instant so tests do not sleep."""
    client._core._retry.backoff_base = 0.0
    client._core._repoll_pause = 0.0
    return client


@pytest.fixture
def server() -> FakeServer:
    return FakeServer()


@pytest.fixture
def make_client(server: FakeServer):
    made: list[SandboxClient] = []

    def make(**kwargs: Any) -> SandboxClient:
        kwargs.setdefault("base_url", BASE)
        kwargs.setdefault("api_key", "key-1")
        client = fast(SandboxClient(transport=httpx.MockTransport(server.handler), **kwargs))
        made.append(client)
        return client

    yield make
    for client in made:
        client._core._tracked.clear()
        client.close()


@pytest.fixture
def client(make_client) -> SandboxClient:
    return make_client()


@pytest.fixture
async def aclient(server: FakeServer):
    client = fast(AsyncSandboxClient(base_url=BASE, api_key="key-1", transport=httpx.MockTransport(server.handler)))
    yield client
    client._core._tracked.clear()
    await client.close()
