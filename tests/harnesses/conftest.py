"""The real stack for harness runs: a scripted SmolLM2-tokenizer upstream, the recording proxy, and Orchard Env.

The upstream and the proxy run on real uvicorn servers in this process (the sandbox reaches the proxy
over TCP through its model-endpoint port); the service runs as `orchard env serve` (local backend)
with the tools folder mounted. Harness tests need the tools installed (`orchard harness install`,
or `make tools`); without them they skip, saying so.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any, Iterator

import httpx
import pytest
import uvicorn

from orchard import SandboxClient
from orchard.env.runner import ServiceProcess
from orchard.harnesses.tools import default_tools_dir
from tests.harnesses.policy import HelloPolicy

ADMIN = "proxy-admin-test"
SANDBOX_PORT = 8000


def serve(app: Any) -> tuple[uvicorn.Server, threading.Thread, int]:
    """``app`` on a real uvicorn (lifespan on) in a thread, on a free port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.02)
    return server, thread, port


@pytest.fixture(scope="session")
def tokenizer():
    from orchard.inference.weights import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="session")
def policy() -> HelloPolicy:
    return HelloPolicy()


@pytest.fixture(scope="session")
def upstream(tokenizer, policy) -> Iterator[str]:
    from orchard.inference.api import create_app
    from orchard.inference.scripted import ScriptedEngine

    engine = ScriptedEngine(tokenizer, policy=policy, model_name="scripted", max_context=400_000)
    server, thread, port = serve(create_app(engine))
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="session")
def proxy(upstream, tmp_path_factory) -> Iterator[dict]:
    from orchard.proxy.app import ProxySettings, create_app

    store = tmp_path_factory.mktemp("proxy-store")
    server, thread, port = serve(create_app(ProxySettings(upstream_url=upstream, store_dir=str(store), admin_keys=[ADMIN])))
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60) as admin:
        yield {"port": port, "admin": admin, "store": store}
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="session")
def tools_dir():
    return default_tools_dir()


@pytest.fixture(scope="session")
def service(proxy, tools_dir, tmp_path_factory) -> Iterator[ServiceProcess]:
    if os.geteuid() != 0:
        pytest.skip("the local backend needs root here")
    tools_dir.mkdir(parents=True, exist_ok=True)
    env = {"ORCHARD_TOOLS_DIR": str(tools_dir), "ORCHARD_FORWARD_ALLOWLIST": f"127.0.0.1:{proxy['port']}",
           "ORCHARD_DEFAULT_MEMORY": "4Gi", "ORCHARD_DEFAULT_CPU": "2"}
    svc = ServiceProcess(state_dir=tmp_path_factory.mktemp("state"), env=env)
    svc.start()
    yield svc
    svc.stop()


@pytest.fixture
def client(service) -> Iterator[SandboxClient]:
    with SandboxClient(base_url=service.url) as c:
        yield c


@pytest.fixture
def sandbox(client, proxy):
    """A closed sandbox (no network) whose 127.0.0.1:8000 reaches the proxy, with an empty /workspace."""
    endpoint = {"port": SANDBOX_PORT, "target": f"127.0.0.1:{proxy['port']}"}
    with client.create_sandbox("host", timeout=120, model_endpoint=endpoint) as sb:
        assert sb.exec("mkdir -p /workspace").exit_code == 0
        yield sb
