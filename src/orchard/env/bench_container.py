"""`orchard env bench --backend container`: exec latency of the container backend's two paths, and of `podman exec`.

All three run `true` (argv, no shell) in the backend's `host` image on the same engine:

- fast path: the helper enters the container (the engine runs on this host);
- API path: the engine's exec create/start/inspect, as for a remote engine;
- baseline: the `podman exec` CLI.

Each path is measured in-process (a backend call) and, for the two backend paths, through the
service and the SDK (an HTTP round trip, comparable with the local backend's figure).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Optional

from orchard.env.backends.base import ExecSpec, SandboxSpec
from orchard.env.bench import percentiles
from orchard.env.podman import PodmanService, podman
from orchard.env.runner import ServiceProcess
from orchard.env.settings import Settings


async def backend_latency(docker_host: str, mode: str, samples: int, state_dir: Path,
                          namespace: str = "orchard-bench") -> dict:
    """p50/p99 of `ContainerBackend.exec(['true'])` with container_exec=mode ('auto' or 'api')."""
    from orchard.env.backends.container import ContainerBackend

    backend = ContainerBackend(Settings(backend="container", docker_host=docker_host, container_exec=mode,
                                        state_dir=state_dir, namespace=namespace))
    await backend.start(_ignore_exit)
    sid = f"bench-{mode}-{int(time.time() * 1000) % 10**8}"
    try:
        await backend.create(SandboxSpec(sandbox_id=sid, image="host", cpu=1.0, memory=512 * 2**20, pids=256,
                                         created_at=time.time()))
        path = "fast (helper)" if backend._boxes[sid].fast else "engine API"
        times = []
        for _ in range(samples + 3):
            t = time.perf_counter()
            outcome = await backend.exec(sid, ExecSpec(argv=["true"], timeout=30))
            times.append(time.perf_counter() - t)
            if outcome.exit_code != 0:
                raise RuntimeError(f"`true` failed on the {mode} path: {outcome}")
        return {"path": path, "exec_true_ms": percentiles(times[3:])}
    finally:
        await backend.delete(sid)
        await backend.close()


async def _ignore_exit(sandbox_id: str, message: str) -> None:
    return None


def sdk_latency(docker_host: str, mode: str, samples: int) -> dict:
    """p50/p99 of `sandbox.exec(['true'])` through a service with the container backend."""
    from orchard.client.sync import SandboxClient

    env = {"ORCHARD_BACKEND": "container", "ORCHARD_DOCKER_HOST": docker_host, "ORCHARD_CONTAINER_EXEC": mode}
    with ServiceProcess(env=env) as service, SandboxClient(base_url=service.url) as client:
        t = time.perf_counter()
        with client.create_sandbox("host") as sb:
            created = time.perf_counter() - t
            times = []
            for _ in range(samples + 3):
                t = time.perf_counter()
                sb.exec(["true"])
                times.append(time.perf_counter() - t)
    return {"exec_true_ms": percentiles(times[3:]), "create_ready_ms": round(created * 1000, 1)}


def podman_exec_latency(image: str, samples: int) -> dict:
    """p50/p99 of `podman exec CID true` (the CLI, as a user would run it)."""
    run = podman("run", "-d", "--network", "none", "--entrypoint", "sleep", image, "infinity")
    if run.returncode != 0:
        return {"skipped": f"podman run failed: {run.stderr.strip()[-300:]}"}
    cid = run.stdout.strip()
    try:
        times = []
        for _ in range(samples + 3):
            t = time.perf_counter()
            podman("exec", cid, "true")
            times.append(time.perf_counter() - t)
    finally:
        podman("rm", "-f", "-t", "0", cid)
    return {"exec_true_ms": percentiles(times[3:])}


def measure(docker_host: str, samples: int, sdk: bool = True) -> dict:
    """Every figure of this benchmark as one dict."""
    import docker

    from orchard.env.backends.container_images import ensure_host_image

    with docker.APIClient(base_url=docker_host, timeout=300) as api:
        image = ensure_host_image(api)
    report: dict = {"docker_host": docker_host, "image": image, "samples": samples, "backend": {}, "sdk": {}}
    with tempfile.TemporaryDirectory(prefix="orchard-bench-") as state:
        for mode in ("auto", "api"):
            report["backend"][mode] = asyncio.run(backend_latency(docker_host, mode, samples, Path(state)))
    if sdk:
        for mode in ("auto", "api"):
            report["sdk"][mode] = sdk_latency(docker_host, mode, samples)
    report["podman_exec"] = podman_exec_latency(image, samples)
    return report


def main(args: argparse.Namespace) -> int:
    with ExitStack() as stack:
        docker_host: Optional[str] = args.docker_host
        if not docker_host:
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="orchard-podman-"))
            docker_host = stack.enter_context(PodmanService(f"{folder}/api.sock")).url
        try:
            report = measure(docker_host, args.latency_samples)
        except (RuntimeError, subprocess.SubprocessError) as e:
            print(json.dumps({"error": str(e)}))
            return 1
    print(json.dumps(report, indent=None if args.json else 2))
    return 0
