"""Two `orchard env serve --backend kubernetes --store redis` replicas on one fake cluster and one real
redis-server, driven alternately through the SDK: whichever replica created a sandbox, the other serves
its execs, files and terminals, and deleting it from either leaves no Secret or NetworkPolicy behind."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from orchard import SandboxClient
from orchard.env.runner import ServiceProcess, free_port
from tests.env.kube_fake import FakeCluster, skip_without_bwrap

from ..redis_server import RedisServer, need_redis

NS = "orchard-sandboxes"
KEY = "replica-key"


class KubeReplicas:
    """The fake cluster, redis-server, replicas a and b, and one SDK client on each."""

    def __init__(self, root: Path):
        self.cluster = FakeCluster(root / "kube").start()
        self.redis = RedisServer(root / "redis").start()
        self.model_target = f"127.0.0.1:{free_port()}"      # allowed, never contacted: only the policy is checked
        env = {"ORCHARD_BACKEND": "kubernetes", "ORCHARD_KUBE_CONFIG": str(self.cluster.kubeconfig),
               "ORCHARD_STORE": "redis", "ORCHARD_REDIS_URL": self.redis.url, "ORCHARD_API_KEYS": KEY,
               "ORCHARD_FORWARD_ALLOWLIST": self.model_target,
               "ORCHARD_LEASE_SECONDS": "2", "ORCHARD_RECONCILE_INTERVAL": "1"}
        self.services = [ServiceProcess(state_dir=root / name, env={**env, "ORCHARD_REPLICA_ID": name}, args=[])
                         for name in ("a", "b")]
        for service, name in zip(self.services, ("a", "b")):
            service.log_path = root / f"{name}.log"
            service.start()
        self.a, self.b = (SandboxClient(base_url=s.url, api_key=KEY) for s in self.services)

    def objects(self, sandbox_id: str) -> set[str]:
        """Names of the Secrets and NetworkPolicies of one sandbox still in the cluster."""
        names = set()
        for path in (f"/api/v1/namespaces/{NS}/secrets", f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies"):
            items = httpx.get(self.cluster.url + path, params={"labelSelector": f"orchard.dev/sandbox={sandbox_id}"},
                              timeout=10).json()["items"]
            names |= {item["metadata"]["name"] for item in items}
        return names

    def until_clean(self, sandbox_id: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.objects(sandbox_id) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert self.objects(sandbox_id) == set(), "the sandbox's Secret or policies outlived its deletion"

    def close(self) -> None:
        for client in (self.a, self.b):
            client.cleanup_all()
            client.close()
        for service in self.services:
            service.stop()
        self.redis.kill()
        self.cluster.stop()


@pytest.fixture
def replicas(tmp_path):
    need_redis()
    skip_without_bwrap()
    made = KubeReplicas(tmp_path)
    yield made
    made.close()


def test_each_replica_serves_the_sandboxes_the_other_created(replicas):
    a, b = replicas.a, replicas.b
    model = {"port": 8000, "target": replicas.model_target}
    first = a.create_sandbox("host", timeout=120, model_endpoint=model)
    second = b.create_sandbox("host", timeout=120, block_network=False)
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

    assert {n for n in replicas.objects(first.sandbox_id) if n.endswith("-model")}, "the model policy exists"
    b.delete_sandbox(first.sandbox_id)                       # created on a, deleted on b
    a.delete_sandbox(second.sandbox_id)                      # created on b, deleted on a
    replicas.until_clean(first.sandbox_id)
    replicas.until_clean(second.sandbox_id)
