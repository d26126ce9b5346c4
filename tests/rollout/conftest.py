"""A real stack for engine tests: Orchard Env (local backend), the scripted model with the oracle, the proxy."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn

from orchard.env.runner import ServiceProcess, free_port
from orchard.harnesses import get_harness
from orchard.rollout.oracle import Oracle, oracle_task
from orchard.rollout.tasks import echo_tasks


def serve(app) -> tuple[str, uvicorn.Server]:
    """Run an ASGI app on a real uvicorn in a thread; its URL and server."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    url = f"http://127.0.0.1:{server.config.port}"
    for _ in range(400):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return url, server
        except httpx.HTTPError:
            time.sleep(0.05)
    raise RuntimeError(f"{app} did not start")


@pytest.fixture(scope="session")
def tokenizer():
    from orchard.inference.weights import load_tokenizer
    return load_tokenizer()


@pytest.fixture(scope="session")
def oracle():
    return Oracle([oracle_task(t) for t in echo_tasks(8)], error_rate=0.0)


@pytest.fixture(scope="session")
def model_url(tokenizer, oracle):
    """The scripted model server answering with the oracle (its error rate is set per test)."""
    from orchard.inference.api import create_app
    from orchard.inference.scripted import ScriptedEngine

    url, server = serve(create_app(ScriptedEngine(tokenizer, policy=oracle)))
    yield url
    server.should_exit = True


def start_proxy(upstream: str, store: Path) -> tuple[str, uvicorn.Server]:
    from orchard.proxy.app import ProxySettings, create_app

    return serve(create_app(ProxySettings(upstream_url=upstream, store_dir=str(store), no_auth=True, durability="flush",
                                          upstream_timeout_s=30)))


@pytest.fixture(scope="session")
def proxy_url(model_url, tmp_path_factory):
    url, server = start_proxy(model_url, tmp_path_factory.mktemp("proxy"))
    yield url
    server.should_exit = True


@pytest.fixture(scope="session")
def dead_proxy_url(tmp_path_factory):
    """A proxy whose upstream refuses connections: every model call is an upstream infrastructure failure."""
    url, server = start_proxy(f"http://127.0.0.1:{free_port()}", tmp_path_factory.mktemp("deadproxy"))
    yield url
    server.should_exit = True


@pytest.fixture(scope="session")
def tools_dir(tmp_path_factory):
    """A tools folder holding the built-in minimal harness, mounted read-only into every sandbox."""
    path = tmp_path_factory.mktemp("tools")
    get_harness("minimal").install(path)
    return path


@pytest.fixture(scope="session")
def env_url(proxy_url, dead_proxy_url, tools_dir):
    ports = [httpx.URL(u).port for u in (proxy_url, dead_proxy_url)]
    env = {"ORCHARD_TOOLS_DIR": str(tools_dir), "ORCHARD_FORWARD_ALLOWLIST": ",".join(f"127.0.0.1:{p}" for p in ports),
           "ORCHARD_DEFAULT_MEMORY": "512Mi", "ORCHARD_DEFAULT_DISK": "256Mi"}
    with ServiceProcess(env=env, args=["--no-auth"]) as service:
        yield service.url
        delete_all(service.url)   # a killed run leaves its sandboxes to their TTL; reap them before the state dir goes


def delete_all(url: str) -> None:
    from orchard import SandboxClient

    with SandboxClient(base_url=url) as client:
        for info in client.list_sandboxes():
            client.delete_sandbox(info.sandbox_id)
