"""The contract suite: every backend must pass it, through the real service on a real uvicorn and the SDK.

By default it starts `orchard env serve` (local backend) with a fresh state dir. Point it at any
running service with ORCHARD_TEST_URL (and ORCHARD_TEST_KEY_A / _KEY_B / _ADMIN_KEY) to check another backend.
"""

from __future__ import annotations

import http.server as http_server
import os
import threading
from pathlib import Path

import httpx
import pytest

from orchard import SandboxClient
from orchard.env.runner import ServiceProcess, free_port

KEY_A, KEY_B, ADMIN = "key-a-123", "key-b-456", "admin-789"
IMAGE = os.environ.get("ORCHARD_TEST_IMAGE", "host")


class _Echo(http_server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"model-endpoint-ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="session")
def model_server():
    """A host HTTP server standing in for the harness proxy."""
    server = http_server.ThreadingHTTPServer(("127.0.0.1", free_port()), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def service_env(model_port: int) -> dict[str, str]:
    return {"ORCHARD_API_KEYS": f"{KEY_A},{KEY_B}", "ORCHARD_ADMIN_KEYS": ADMIN,
            "ORCHARD_MAX_FILE_BYTES": str(4 * 2**20), "ORCHARD_OUTPUT_LIMIT": str(2**20),
            "ORCHARD_MAX_BODY_BYTES": str(16 * 2**20),
            "ORCHARD_FORWARD_ALLOWLIST": f"127.0.0.1:{model_port}", "ORCHARD_RECONCILE_INTERVAL": "1",
            "ORCHARD_DEFAULT_MEMORY": "512Mi", "ORCHARD_DEFAULT_DISK": "256Mi", "ORCHARD_DEFAULT_PIDS": "256"}


@pytest.fixture(scope="session")
def service(model_server, tmp_path_factory):
    """The service under test: its URL and, when started here, the process."""
    url = os.environ.get("ORCHARD_TEST_URL")
    if url:
        yield type("External", (), {"url": url, "proc": None})()
        return
    svc = ServiceProcess(state_dir=tmp_path_factory.mktemp("state"), env=service_env(model_server), args=[])
    svc.start()
    yield svc
    svc.stop()


@pytest.fixture
def url(service) -> str:
    return service.url


@pytest.fixture
def client(url):
    with SandboxClient(base_url=url, api_key=os.environ.get("ORCHARD_TEST_KEY_A", KEY_A)) as c:
        yield c


@pytest.fixture
def sandbox(client):
    with client.create_sandbox(IMAGE, timeout=60) as sb:
        yield sb


@pytest.fixture
def http(url):
    """Raw HTTP with key A, for status codes the SDK turns into exceptions."""
    with httpx.Client(base_url=url, headers={"X-API-Key": KEY_A}, timeout=60) as c:
        yield c


def state_dir(service) -> Path:
    return Path(service.state_dir)
