"""The contract suite, unchanged, against the Kubernetes backend on the fake API server and kubelet.

Each module here re-exports one module of tests/env/contract. The service under test is
`orchard env serve --backend kubernetes` with a kubeconfig pointing at tests/env/kube_fake, whose
kubelet runs every pod as local bubblewrap processes with the real in-pod agent. What the fake
cannot show is skipped with the reason: it applies no resource limits (a cluster's kubelet does),
it emulates NetworkPolicies only for closed pods (a network namespace of their own, with relays for
the agent and for loopback allowances: kube_fake/network.py), so networked pods share this
machine's network; the pod and policy objects are checked in
tests/env/backends/test_kubernetes_manifests.py. The backend has no snapshots, and its
model_endpoint is checked by test_model_endpoint.py here (a NetworkPolicy is pod-wide).
"""

from __future__ import annotations

import pytest

from orchard.env.runner import ServiceProcess
from tests.env.contract.conftest import client, http, model_server, sandbox, service_env, url  # noqa: F401
from tests.env.kube_fake import FakeCluster, skip_without_bwrap

NO_POLICY = ("the fake runs networked pods in this machine's network namespace and enforces no NetworkPolicy "
             "for them (on a cluster the CNI does; the policies are unit-tested)")
NO_LIMITS = ("the fake kubelet applies no cgroup limits (on a cluster the kubelet enforces the pod's "
             "limits; the pod's resources are unit-tested)")
CANNOT_HOLD = {
    "test_networked_sandbox_cannot_reach_the_host": NO_POLICY,
    "test_memory_limit_contains_a_hog": NO_LIMITS,
    "test_disk_filler_is_contained": NO_LIMITS,
    "test_pids_limit_contains_a_fork_bomb": NO_LIMITS + "; Kubernetes has no per-pod pids limit field either "
                                            "(the node's podPidsLimit applies)",
    "test_model_endpoint_reaches_only_its_target": "a NetworkPolicy is pod-wide: the egress that lets the agent's "
                                                   "relay reach the target lets the sandbox open it directly too; "
                                                   "test_model_endpoint.py here checks what holds",
    "test_snapshot_then_start_from_it": "the Kubernetes API cannot commit a pod's filesystem (snapshot raises "
                                        "a clear BackendError)",
    "test_oci_image_from_local_podman_storage": "images come from the cluster's registries, not local Podman storage",
}


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    skip_without_bwrap()
    fake = FakeCluster(tmp_path_factory.mktemp("kube-fake")).start()
    yield fake
    fake.stop()


def kube_env(cluster: FakeCluster) -> dict[str, str]:
    return {"ORCHARD_BACKEND": "kubernetes", "ORCHARD_KUBE_CONFIG": str(cluster.kubeconfig)}


@pytest.fixture(scope="session")
def service(cluster, model_server, tmp_path_factory):
    """`orchard env serve --backend kubernetes` with the contract suite's keys and limits."""
    svc = ServiceProcess(state_dir=tmp_path_factory.mktemp("kube-state"),
                         env={**service_env(model_server), **kube_env(cluster)}, args=[])
    svc.start()
    yield svc
    svc.stop()


@pytest.fixture(autouse=True)
def _kubernetes_backend(request, cluster, monkeypatch):
    """Services a test starts itself (restart) use the Kubernetes backend too; skip what the fake cannot show."""
    for key, value in kube_env(cluster).items():
        monkeypatch.setenv(key, value)
    why = CANNOT_HOLD.get(request.node.originalname)
    if why:
        pytest.skip(why)
