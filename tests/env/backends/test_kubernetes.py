"""The Kubernetes backend end to end against the fake API server and kubelet, run in-process so tests see every call.

Covers what the contract suite cannot: image-pull failures with their reason, the API calls of one
sandbox lifecycle, a pod that dies by itself, adoption after a restart, the token staying out of
the sandbox's reach, and reconciliation's minimum age through a real service.
"""

from __future__ import annotations

import asyncio
import base64
import http.server
import os
import signal
import threading
import time

import httpx
import pytest

from orchard import errors
from orchard.env.backends import kubernetes_pods as pods
from orchard.env.backends.base import ExecSpec, SandboxSpec
from orchard.env.backends.kubernetes import KubernetesBackend
from orchard.env.runner import ServiceProcess, free_port
from orchard.env.settings import Settings
from tests.env.kube_fake import kubeconfig, skip_without_bwrap
from tests.env.kube_fake.api import FakeApiServer, Store
from tests.env.kube_fake.kubelet import Kubelet

NS = "orchard-sandboxes"


class Cluster:
    def __init__(self, root):
        self.store = Store([NS])
        self.kubelet = Kubelet(self.store, root / "kubelet")
        self.server = FakeApiServer(("127.0.0.1", free_port()), self.store, [])
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.kubeconfig = root / "kubeconfig"
        self.kubeconfig.write_text(kubeconfig(self.url))
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.stop()
        self.kubelet.stop_all()

    def names(self, kind: str) -> set[str]:
        return {name for (k, _, name) in self.store.objects if k == kind}


@pytest.fixture
def cluster(tmp_path):
    skip_without_bwrap()
    c = Cluster(tmp_path)
    yield c
    c.stop()


@pytest.fixture
async def backend(tmp_path, cluster):
    b, exits = await started(tmp_path, cluster)
    b.exits = exits
    yield b
    await b.close()


async def started(tmp_path, cluster: Cluster) -> tuple[KubernetesBackend, list]:
    exits: list[tuple[str, str]] = []

    async def on_exit(sandbox_id: str, message: str) -> None:
        exits.append((sandbox_id, message))

    b = KubernetesBackend(Settings(backend="kubernetes", state_dir=tmp_path / "state", kube_config=cluster.kubeconfig))
    await b.start(on_exit)
    return b, exits


def spec(sid: str, image: str = "host", **kw) -> SandboxSpec:
    return SandboxSpec(sid, image, created_at=kw.pop("created_at", time.time()), **kw)


async def gone(cluster: Cluster, sid: str) -> None:
    deadline = time.monotonic() + 30
    while pods.pod_name(sid) in cluster.names("pods") and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert pods.pod_name(sid) not in cluster.names("pods")


@pytest.mark.parametrize("image, reason", [("registry.example/missing:1", "ErrImagePull"),
                                           ("no-such-image:1", "ErrImagePull"),
                                           ("/nonexistent/rootfs", "InvalidImageName")])
async def test_image_pull_failure_is_failed_with_reason(backend, cluster, image, reason):
    with pytest.raises(errors.SandboxFailedError) as err:
        await backend.create(spec("pull", image))
    assert reason in err.value.detail and image in err.value.detail and "Available: host" in err.value.detail
    await gone(cluster, "pull")
    assert pods.secret_name("pull") not in cluster.names("secrets")


@pytest.mark.parametrize("block_network, objects", [(True, {"secrets", "pods"}),
                                                    (False, {"secrets", "pods", "networkpolicies"})])
async def test_api_calls_of_one_lifecycle(backend, cluster, block_network, objects):
    before = len(cluster.store.calls)
    await backend.create(spec("calls", block_network=block_network))
    assert (await backend.exec("calls", ExecSpec(["true"]))).exit_code == 0
    await backend.delete("calls")
    calls = cluster.store.calls[before:]
    assert sorted(kind for verb, kind, _ in calls if verb == "create") == sorted(objects)
    assert sorted(kind for verb, kind, _ in calls if verb == "delete") == sorted(objects)
    assert not [c for c in calls if c[0] == "list"], "readiness comes from the watch, never from listing"
    await gone(cluster, "calls")
    assert not cluster.names("secrets") and not {n for n in cluster.names("networkpolicies") if "calls" in n}


async def test_concurrent_creates_are_all_woken(backend, cluster):
    ids = [f"many-{i}" for i in range(8)]
    await asyncio.gather(*(backend.create(spec(sid)) for sid in ids))
    outs = await asyncio.gather(*(backend.exec(sid, ExecSpec(["hostname"])) for sid in ids))
    assert [o.stdout.decode().strip() for o in outs] == ids
    await asyncio.gather(*(backend.delete(sid) for sid in ids))
    assert not [c for c in cluster.store.calls if c[0] == "list" and c[1] == "pods"][1:], "no polling"


async def test_a_pod_that_dies_is_reported(backend, cluster):
    await backend.create(spec("dies"))
    with cluster.kubelet.lock:
        proc = next(iter(cluster.kubelet.procs.values()))
    os.killpg(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while not backend.exits and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert backend.exits and backend.exits[0][0] == "dies" and "exit code 137" in backend.exits[0][1]
    with pytest.raises(errors.SandboxNotFoundError):
        await backend.exec("dies", ExecSpec(["true"]))


async def test_adopt_after_a_restart(tmp_path, backend, cluster):
    await backend.create(spec("kept"))
    await backend.write_file("kept", "/workspace/f", b"before", None)
    again, _ = await started(tmp_path, cluster)
    try:
        assert await again.adopt(spec("kept")) is True
        assert await again.read_file("kept", "/workspace/f", 100) == b"before"
        assert await again.adopt(spec("never-was")) is False
    finally:
        await again.close()


async def test_token_never_reaches_the_sandbox(backend, cluster):
    await backend.create(spec("secret"))
    data = cluster.store.get("secrets", NS, pods.secret_name("secret"))["data"]["token"]
    token = base64.b64decode(data).decode()
    probe = ("for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline /run/orchard-agent/*; do cat $f 2>/dev/null; done; "
             "env; cat /proc/[0-9]*/mem 2>&1 | head -c 100")
    out = await backend.exec("secret", ExecSpec(["bash", "-c", probe]))
    assert token not in (out.stdout + out.stderr).decode(errors="replace")
    pod = cluster.store.get("pods", NS, pods.pod_name("secret"))
    assert token not in str(pod), "the token lives in the Secret only"
    out = await backend.exec("secret", ExecSpec(["python3", "-c", AGENT_MEMORY]))
    assert out.stdout.decode().split() == ["PermissionError"] * 3, out     # the agent is not dumpable


AGENT_MEMORY = """
import os
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        agent = b'orchard_agent' in open(f'/proc/{pid}/cmdline', 'rb').read()
        comm = open(f'/proc/{pid}/comm').read().strip()
    except OSError:
        continue
    if agent and comm != 'bwrap' and pid != str(os.getpid()):     # bwrap: the fake kubelet's, not a pod's
        for name in ('mem', 'environ', 'maps'):
            try:
                open(f'/proc/{pid}/{name}', 'rb').read(1)
                print('readable')
            except OSError as e:
                print(type(e).__name__)
"""


async def test_what_the_backend_cannot_do_says_so(backend):
    with pytest.raises(errors.SandboxFailedError, match="model_endpoint target 'no-such-host.invalid'"):
        await backend.create(spec("ep", model_endpoint=(8000, "no-such-host.invalid", 9)))
    with pytest.raises(errors.SandboxFailedError, match="agent's port"):
        await backend.create(spec("ep", model_endpoint=(7070, "127.0.0.1", 9)))
    with pytest.raises(errors.SandboxNotFoundError):
        await backend.exec("nobody", ExecSpec(["true"]))
    await backend.create(spec("snap"))
    with pytest.raises(errors.BackendError, match="Snapshots"):
        await backend.snapshot("snap", "@me/x")


class _Model(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"model-ok {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def model_port():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Model)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


FETCH = "import urllib.request, sys; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
CONNECT = "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 3); print('connected')"


async def test_model_endpoint_relays_through_the_agent_and_allows_only_its_target(backend, cluster, model_port):
    """Two closed sandboxes listen on the same 127.0.0.1:8000 (each in its own pod) and reach the model there;
    the policy allows exactly the target, the pod reaches nothing else, and delete removes the policy."""
    before = len(cluster.store.calls)
    await asyncio.gather(*(backend.create(spec(sid, model_endpoint=(8000, "127.0.0.1", model_port)))
                           for sid in ("ep-a", "ep-b")))
    policy = cluster.store.get("networkpolicies", NS, pods.model_name("ep-a"))
    assert policy["spec"]["egress"] == [{"to": [{"ipBlock": {"cidr": "127.0.0.1/32"}}],
                                         "ports": [{"protocol": "TCP", "port": model_port}]}]
    for sid in ("ep-a", "ep-b"):
        out = await backend.exec(sid, ExecSpec(["python3", "-c", FETCH, f"http://127.0.0.1:8000/{sid}"]))
        assert out.stdout.decode().strip() == f"model-ok /{sid}", out.stderr
    api_port = cluster.server.server_address[1]
    elsewhere = await backend.exec("ep-a", ExecSpec(["python3", "-c", CONNECT, str(api_port)]))
    assert elsewhere.exit_code != 0 and b"connected" not in elsewhere.stdout
    env = await backend.exec("ep-a", ExecSpec(["env"]))
    assert b"ORCHARD_AGENT" not in env.stdout
    await asyncio.gather(backend.delete("ep-a"), backend.delete("ep-b"))
    calls = cluster.store.calls[before:]
    assert sorted(k for verb, k, _ in calls if verb == "create") == ["networkpolicies"] * 2 + ["pods"] * 2 + \
        ["secrets"] * 2
    assert not {n for n in cluster.names("networkpolicies") if "ep-" in n}


async def test_a_relay_that_cannot_listen_fails_the_sandbox_with_the_reason(backend, cluster):
    """Port 80 needs CAP_NET_BIND_SERVICE, which sandbox containers drop: the agent exits saying so."""
    with pytest.raises(errors.SandboxFailedError) as err:
        await backend.create(spec("ep-80", model_endpoint=(80, "127.0.0.1", 9)))
    assert "model endpoint relay" in err.value.detail and "Permission denied" in err.value.detail
    await gone(cluster, "ep-80")
    assert pods.model_name("ep-80") not in cluster.names("networkpolicies")


def test_reconcile_removes_only_old_unowned_sandboxes(tmp_path, cluster):
    """A sandbox no record owns is deleted once older than reconcile_min_age, and not before."""
    async def plant() -> None:
        b, _ = await started(tmp_path, cluster)
        await b.create(spec("old-orphan", created_at=time.time() - 3600))
        await b.create(spec("young-orphan"))
        await b.close()

    asyncio.run(plant())
    env = {"ORCHARD_BACKEND": "kubernetes", "ORCHARD_KUBE_CONFIG": str(cluster.kubeconfig),
           "ORCHARD_RECONCILE_INTERVAL": "0.5", "ORCHARD_RECONCILE_MIN_AGE": "600", "ORCHARD_NO_AUTH": "1"}
    svc = ServiceProcess(state_dir=tmp_path / "svc", env=env, args=[]).start()
    try:
        deadline = time.monotonic() + 60
        while pods.pod_name("old-orphan") in cluster.names("pods") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pods.pod_name("old-orphan") not in cluster.names("pods")
        assert pods.secret_name("old-orphan") not in cluster.names("secrets")
        assert httpx.get(f"{svc.url}/health").status_code == 200
        assert pods.pod_name("young-orphan") in cluster.names("pods")
    finally:
        svc.stop()
