"""Exec and create latency of the Kubernetes backend on the fake cluster: ``python -m tests.env.kube_fake.bench``.

What it measures is the backend's own path on this machine (watch-driven readiness, the agent's
HTTP round trip over loopback, a bubblewrap "pod"), not a cluster: scheduling, image pulls and the
pod network are absent. Prints JSON: backend-direct `true` exec p50/p90/p99, and through the
service and SDK (`orchard.env.bench.exec_latency`), with create-to-ready for both.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from orchard.env.backends.base import ExecSpec, SandboxSpec
from orchard.env.backends.kubernetes import KubernetesBackend
from orchard.env.bench import exec_latency, percentiles
from orchard.env.runner import ServiceProcess
from orchard.env.settings import Settings

from . import FakeCluster


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="orchard-kube-bench-"))
    cluster = FakeCluster(root / "fake").start()
    try:
        direct = asyncio.run(backend_latency(cluster, root / "state", args.samples))
        env = {"ORCHARD_BACKEND": "kubernetes", "ORCHARD_KUBE_CONFIG": str(cluster.kubeconfig), "ORCHARD_NO_AUTH": "1"}
        svc = ServiceProcess(state_dir=root / "svc", env=env, args=[]).start()
        try:
            through = exec_latency(svc.url, None, "host", args.samples)
        finally:
            svc.stop()
    finally:
        cluster.stop()
    print(json.dumps({"backend": "kubernetes (fake API server, loopback agent)", "backend_direct": direct,
                      "service_sdk": through}, indent=1))


if __name__ == "__main__":
    main()
