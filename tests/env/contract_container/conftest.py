"""The contract suite, unchanged, against the container backend on a real Podman API service.

Each module here re-exports one module of tests/env/contract. The service under test is
`orchard env serve --backend container` talking to a private `podman system service` socket, and
every test runs twice: [auto] through the fast path (the helper enters the containers) and [api]
through the engine API only, as for a remote engine. The image is the suite's IMAGE
(ORCHARD_TEST_IMAGE, default `host`: for this backend an OCI image built from this machine's bash,
python3, git, procps, iproute2 packages), and tests that name "host" directly (restart, exec after
delete) get the same image. A test that cannot hold for this engine is skipped, with the reason.
"""

from __future__ import annotations

import pytest

from orchard.env.runner import ServiceProcess
from tests.env.contract.conftest import client, http, model_server, sandbox, service_env, url  # noqa: F401
from tests.env.podman_api import Engine, podman_engine


@pytest.fixture(scope="session")
def engine() -> Engine:
    yield from podman_engine()


@pytest.fixture(scope="session", params=["auto", "api"])
def exec_path(request) -> str:
    """auto: the helper enters the containers (the engine runs here); api: engine API only, as for a remote engine."""
    return request.param


def container_env(engine: Engine, exec_path: str) -> dict[str, str]:
    return {"ORCHARD_BACKEND": "container", "ORCHARD_DOCKER_HOST": engine.url, "ORCHARD_NAMESPACE": engine.namespace,
            "ORCHARD_CONTAINER_EXEC": exec_path}


@pytest.fixture(scope="session")
def service(engine, exec_path, model_server, tmp_path_factory):
    """`orchard env serve --backend container` with the contract suite's keys and limits."""
    env = {**service_env(model_server), **container_env(engine, exec_path)}
    svc = ServiceProcess(state_dir=tmp_path_factory.mktemp("container-state"), env=env, args=[])
    svc.start()
    yield svc
    svc.stop()


@pytest.fixture(autouse=True)
def _container_backend(request, engine, exec_path, monkeypatch):
    """Services a test starts itself (restart) use the container backend too; skip what this engine cannot do."""
    for key, value in container_env(engine, exec_path).items():
        monkeypatch.setenv(key, value)
    why = _cannot_hold(request.node.originalname, engine, exec_path)
    if why:
        pytest.skip(why)


def _cannot_hold(test: str, engine: Engine, exec_path: str) -> str:
    if test == "test_disk_filler_is_contained" and not engine.disk_quota:
        return ("the engine's storage cannot cap a container's writable layer (Podman's overlay needs xfs "
                "with pquota); the backend asks for the size and warns when the engine refuses it")
    return ""
