"""Exec and create latency of the Kubernetes backend on the fake cluster: ``python -m tests.env.kube_fake.bench``.

What it measures is the backend's own path on this machine (watch-driven readiness, the agent's
HTTP round trip over loopback, a bubblewrap "pod"), not a cluster: scheduling, image pulls and the
pod network are absent. Prints JSON: backend-direct `true` exec p50/p90/p99, and through the
service and SDK (`orchard.env.bench.exec_latency`), with create-to-ready for both; and an HTTP GET
(a new connection each) from inside a closed sandbox through its model_endpoint, beside the same GET
made directly on this machine (on the fake the path has two relays: the agent's and the fake network's);
and, for sandboxes one backend created, a second backend's (replica's) first exec, which attaches to the
sandbox (its token Secret, the agent's info), beside its second.
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import json
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from orchard.env.backends.base import ExecSpec, SandboxSpec
from orchard.env.backends.kubernetes import KubernetesBackend
from orchard.env.bench import exec_latency, percentiles
from orchard.env.runner import ServiceProcess
from orchard.env.settings import Settings

from . import FakeCluster

GETS = """
import json, sys, time, urllib.request
took = []
for _ in range(int(sys.argv[1])):
    t = time.perf_counter()
    urllib.request.urlopen("http://127.0.0.1:8000/", timeout=10).read()
    took.append(time.perf_counter() - t)
print(json.dumps(took))
"""


class _Model(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args) -> None:
        pass


async def backend_latency(cluster: FakeCluster, state: Path, samples: int) -> dict:
    async def ignore(sandbox_id: str, message: str) -> None:
        return None

    backend = KubernetesBackend(Settings(backend="kubernetes", state_dir=state, kube_config=cluster.kubeconfig))
    await backend.start(ignore)
    creates, rtt = [], []
    try:
        for i in range(10):
            t = time.perf_counter()
            await backend.create(SandboxSpec(f"bench-{i}", "host", created_at=time.time()))
            creates.append(time.perf_counter() - t)
            await backend.delete(f"bench-{i}")
        await backend.create(SandboxSpec("bench", "host", created_at=time.time()))
        for _ in range(samples):
            t = time.perf_counter()
            await backend.exec("bench", ExecSpec(["true"]))
            rtt.append(time.perf_counter() - t)
        await backend.delete("bench")
    finally:
        await backend.close()
    return {"exec_true_ms": percentiles(rtt), "create_ready_ms": percentiles(creates)}


async def model_endpoint_latency(cluster: FakeCluster, state: Path, samples: int) -> dict:
    async def ignore(sandbox_id: str, message: str) -> None:
        return None

    model = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Model)
    threading.Thread(target=model.serve_forever, daemon=True).start()
    port = model.server_address[1]
    direct = []
    for _ in range(samples):
        t = time.perf_counter()
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).read()
        direct.append(time.perf_counter() - t)
    backend = KubernetesBackend(Settings(backend="kubernetes", state_dir=state, kube_config=cluster.kubeconfig))
    await backend.start(ignore)
    try:
        await backend.create(SandboxSpec("bench-model", "host", model_endpoint=(8000, "127.0.0.1", port),
                                         created_at=time.time()))
        out = await backend.exec("bench-model", ExecSpec(["python3", "-c", GETS, str(samples)], timeout=600))
        await backend.delete("bench-model")
    finally:
        await backend.close()
        model.shutdown()
    return {"through_model_endpoint_ms": percentiles(json.loads(out.stdout)), "direct_on_host_ms": percentiles(direct)}


async def other_replica_latency(cluster: FakeCluster, state: Path, sandboxes: int) -> dict:
    async def ignore(sandbox_id: str, message: str) -> None:
        return None

    a, b = (KubernetesBackend(Settings(backend="kubernetes", state_dir=state / name, kube_config=cluster.kubeconfig))
            for name in ("a", "b"))
    await a.start(ignore)
    await b.start(ignore)
    first, second = [], []
    try:
        for i in range(sandboxes):
            await a.create(SandboxSpec(f"bench-shared-{i}", "host", created_at=time.time()))
            for took in (first, second):
                t = time.perf_counter()
                await b.exec(f"bench-shared-{i}", ExecSpec(["true"]))
                took.append(time.perf_counter() - t)
            await a.delete(f"bench-shared-{i}")
    finally:
        await a.close()
        await b.close()
    return {"sandboxes": sandboxes, "first_exec_ms": percentiles(first), "second_exec_ms": percentiles(second)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="orchard-kube-bench-"))
    cluster = FakeCluster(root / "fake").start()
    try:
        direct = asyncio.run(backend_latency(cluster, root / "state", args.samples))
        model = asyncio.run(model_endpoint_latency(cluster, root / "state-model", args.samples))
        replica = asyncio.run(other_replica_latency(cluster, root / "state-replicas", min(args.samples, 30)))
        env = {"ORCHARD_BACKEND": "kubernetes", "ORCHARD_KUBE_CONFIG": str(cluster.kubeconfig), "ORCHARD_NO_AUTH": "1"}
        svc = ServiceProcess(state_dir=root / "svc", env=env, args=[]).start()
        try:
            through = exec_latency(svc.url, None, "host", args.samples)
        finally:
            svc.stop()
    finally:
        cluster.stop()
    print(json.dumps({"backend": "kubernetes (fake API server, loopback agent)", "backend_direct": direct,
                      "service_sdk": through, "model_endpoint_get": model,
                      "other_replica": replica}, indent=1))


if __name__ == "__main__":
    main()
