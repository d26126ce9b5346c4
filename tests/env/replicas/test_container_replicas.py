"""Two `orchard env serve --backend container --store redis` replicas on one Podman API service and one real
redis-server, each with its own state dir, driven alternately through the SDK: whichever replica created a
sandbox, the other serves its execs, files, terminals and waits, deletes it, and its lifecycle passes leave
the other's containers alone. Runs through the fast path (auto) and the engine API only (api)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from orchard import SandboxClient
from orchard.env.runner import ServiceProcess
from tests.env.podman_api import Engine, podman_engine

from ..redis_server import RedisServer, need_redis

KEY = "replica-key"


@pytest.fixture(scope="module")
def engine() -> Engine:
    yield from podman_engine()


class ContainerReplicas:
    """redis-server, replicas a and b on one engine, and one SDK client on each."""

    def __init__(self, root: Path, engine: Engine, exec_path: str):
        self.engine = engine
        self.redis = RedisServer(root / "redis").start()
        env = {"ORCHARD_BACKEND": "container", "ORCHARD_DOCKER_HOST": engine.url, "ORCHARD_NAMESPACE": engine.namespace,
               "ORCHARD_CONTAINER_EXEC": exec_path, "ORCHARD_STORE": "redis", "ORCHARD_REDIS_URL": self.redis.url,
               "ORCHARD_API_KEYS": KEY, "ORCHARD_LEASE_SECONDS": "2", "ORCHARD_RECONCILE_INTERVAL": "0.5",
               "ORCHARD_RECONCILE_MIN_AGE": "0", "ORCHARD_DEFAULT_MEMORY": "512Mi", "ORCHARD_DEFAULT_PIDS": "256"}
        self.services = [ServiceProcess(state_dir=root / name, env={**env, "ORCHARD_REPLICA_ID": name}, args=[])
                         for name in ("a", "b")]
        for service, name in zip(self.services, ("a", "b")):
            service.log_path = root / f"{name}.log"
            service.start(timeout=120)
        self.a, self.b = (SandboxClient(base_url=s.url, api_key=KEY) for s in self.services)

    def containers(self, sandbox_id: str) -> list[dict]:
        import docker

        api = docker.APIClient(base_url=self.engine.url, timeout=60)
        try:
            return api.containers(all=True, filters={"label": [f"orchard.sandbox={sandbox_id}",
                                                               f"orchard.namespace={self.engine.namespace}"]})
        finally:
            api.close()

    def until_removed(self, sandbox_id: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.containers(sandbox_id) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert self.containers(sandbox_id) == [], "the sandbox's container outlived its deletion"

    def close(self) -> None:
        for client in (self.a, self.b):
            try:
                client.cleanup_all()
            finally:
                client.close()
        for service in self.services:
            service.stop()
        self.redis.kill()


@pytest.fixture(params=["auto", "api"])
def replicas(request, engine, tmp_path):
    need_redis()
    made = ContainerReplicas(tmp_path, engine, request.param)
    yield made
    made.close()


def test_each_replica_serves_the_sandboxes_the_other_created(replicas):
    a, b = replicas.a, replicas.b
    first = a.create_sandbox("host", timeout=120)
    second = b.create_sandbox("host", timeout=120)
    on_b, on_a = b.get_sandbox(first.sandbox_id), a.get_sandbox(second.sandbox_id)
    assert on_b.wait_ready(timeout=30).status == "ready"

    assert on_b.exec("echo from-b > note; hostname").stdout == f"{first.sandbox_id}\n"
    assert first.download_content("note") == b"from-b\n"
    on_b.upload_content("second write", "/workspace/two")
    assert first.exec("cat /workspace/two").stdout == "second write"
    assert "note" in [entry.name for entry in on_b.list_files(".")]
    with on_b.exec(["sh", "-c", "echo pty-on-b; exit 4"], pty=True) as proc:
        assert proc.wait(timeout=30) == 4
    assert on_a.exec("hostname").stdout == f"{second.sandbox_id}\n"
    assert second.exec("echo again").stdout == "again\n"

    time.sleep(2.0)                          # lifecycle passes on both replicas: each leaves the other's alone
    assert a.get_sandbox(second.sandbox_id).info().status == "ready"
    assert b.get_sandbox(first.sandbox_id).info().status == "ready"
    assert len(replicas.containers(first.sandbox_id)) == len(replicas.containers(second.sandbox_id)) == 1

    b.delete_sandbox(first.sandbox_id)                       # created on a, deleted on b
    a.delete_sandbox(second.sandbox_id)                      # created on b, deleted on a
    replicas.until_removed(first.sandbox_id)
    replicas.until_removed(second.sandbox_id)
