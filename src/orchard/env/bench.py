"""`orchard env bench`: create/exec/delete latency, throughput and memory, with a podman exec baseline."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Optional

import httpx

from orchard.client.aio import AsyncSandboxClient
from orchard.client.sync import SandboxClient
from orchard.env.podman import ensure_busybox_image, podman
from orchard.env.runner import ServiceProcess


def percentiles(values: list[float]) -> dict[str, float]:
    """p50/p90/p99 in milliseconds."""
    if not values:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "n": 0}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000  # noqa: E731
    return {"p50": round(pick(0.50), 2), "p90": round(pick(0.90), 2), "p99": round(pick(0.99), 2), "n": len(values)}


def exec_latency(url: str, key: Optional[str], image: str, samples: int) -> dict:
    """Sequential `true` round trips through the sync SDK, and sequential create-to-ready."""
    rtt, creates = [], []
    with SandboxClient(base_url=url, api_key=key) as client:
        for _ in range(min(20, samples)):
            t = time.perf_counter()
            sb = client.create_sandbox(image)
            creates.append(time.perf_counter() - t)
            sb.delete()
        with client.create_sandbox(image) as sb:
            sb.exec("true")
            for _ in range(samples):
                t = time.perf_counter()
                sb.exec("true")
                rtt.append(time.perf_counter() - t)
    return {"exec_true_ms": percentiles(rtt), "create_ready_ms": percentiles(creates)}


async def _one_sandbox(client: AsyncSandboxClient, image: str, execs: int, stats: dict) -> None:
    try:
        t = time.perf_counter()
        sb = await client.create_sandbox(image)
        stats["create"].append(time.perf_counter() - t)
        for i in range(execs):
            t = time.perf_counter()
            result = await sb.exec(f"echo {i}")
            stats["exec"].append(time.perf_counter() - t)
            if result.exit_code != 0 or result.stdout.strip() != str(i):
                stats["failures"].append(f"exec {i}: {result.status} {result.error}")
        t = time.perf_counter()
        await sb.delete()
        stats["delete"].append(time.perf_counter() - t)
    except Exception as e:  # every failure is counted, none stops the run
        stats["failures"].append(f"{type(e).__name__}: {e}")


async def workload(url: str, key: Optional[str], image: str, n: int, execs: int, concurrency: int) -> dict:
    """N sandboxes × (create, M execs, delete), at most `concurrency` at once."""
    stats: dict = {"create": [], "exec": [], "delete": [], "failures": []}
    gate = asyncio.Semaphore(concurrency)
    async with AsyncSandboxClient(base_url=url, api_key=key, timeout=600) as client:
        async def guarded() -> None:
            async with gate:
                await _one_sandbox(client, image, execs, stats)
        t0 = time.perf_counter()
        await asyncio.gather(*(guarded() for _ in range(n)))
        wall = time.perf_counter() - t0
    return {"sandboxes": n, "execs_per_sandbox": execs, "concurrency": concurrency, "wall_s": round(wall, 2),
            "commands_per_s": round(n * execs / wall, 1), "create_ms": percentiles(stats["create"]),
            "exec_ms": percentiles(stats["exec"]), "delete_ms": percentiles(stats["delete"]),
            "failures": len(stats["failures"]), "failure_samples": stats["failures"][:5]}


def idle_memory(url: str, key: Optional[str], image: str, count: int = 50) -> dict:
    """Memory charged to idle sandboxes (cgroup usage, from /resources admin rows)."""
    with SandboxClient(base_url=url, api_key=key) as client:
        boxes = [client.create_sandbox(image) for _ in range(count)]
        time.sleep(1.0)
        rows = (client.resources().sandboxes or [])
        used = [r.memory_used_bytes for r in rows if r.memory_used_bytes is not None]
        for sb in boxes:
            sb.delete()
    mean = statistics.mean(used) if used else None
    return {"idle_sandboxes": count, "idle_sandbox_mib": round(mean / 2**20, 2) if mean else None}


def podman_baseline(samples: int, containers: int, execs: int) -> dict:
    """The same shapes through the podman CLI on this machine: sequential `podman exec true`, then
    `containers` × (run, M execs, rm) with 8 at once."""
    image = ensure_busybox_image()
    if image is None:
        return {"skipped": "podman (or busybox to build a local image) is not installed"}
    run = podman("run", "-d", "--rm", "--network", "none", image, "sleep", "3600")
    if run.returncode != 0:
        return {"skipped": f"podman run failed: {run.stderr.strip()[-300:]}"}
    cid = run.stdout.strip()
    try:
        rtt = [_timed(lambda: podman("exec", cid, "true")) for _ in range(samples)]
    finally:
        podman("rm", "-f", "-t", "0", cid)
    stats: dict = {"create": [], "exec": [], "delete": [], "failures": []}
    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: _podman_one(image, execs, stats), range(containers)))
    wall = time.perf_counter() - t0
    return {"image": image, "podman_exec_true_ms": percentiles(rtt), "containers": containers,
            "wall_s": round(wall, 2), "commands_per_s": round(containers * execs / wall, 1),
            "create_ms": percentiles(stats["create"]), "exec_ms": percentiles(stats["exec"]),
            "delete_ms": percentiles(stats["delete"]), "failures": len(stats["failures"])}


def _timed(call) -> float:
    t = time.perf_counter()
    call()
    return time.perf_counter() - t


def _podman_one(image: str, execs: int, stats: dict) -> None:
    t = time.perf_counter()
    run = podman("run", "-d", "--network", "none", image, "sleep", "3600")
    stats["create"].append(time.perf_counter() - t)
    if run.returncode != 0:
        stats["failures"].append(run.stderr[-200:])
        return
    cid = run.stdout.strip()
    for i in range(execs):
        t = time.perf_counter()
        done = podman("exec", cid, "sh", "-c", f"echo {i}")
        stats["exec"].append(time.perf_counter() - t)
        if done.stdout.strip() != str(i):
            stats["failures"].append(done.stderr[-200:])
    stats["delete"].append(_timed(lambda: podman("rm", "-f", "-t", "0", cid)))


def _ratio(a: float, b: float) -> float:
    return round(a / b, 1) if b else 0.0


def main(args: argparse.Namespace) -> int:
    if getattr(args, "backend", "local") == "container":
        from orchard.env.bench_container import main as container_main
        return container_main(args)
    with ExitStack() as stack:
        url, service = args.url, None
        if not url:
            service = stack.enter_context(ServiceProcess(args=["--no-auth"]))
            url = service.url
        httpx.get(url + "/health", timeout=5).raise_for_status()
        report = {"url": url, "image": args.image}
        report.update(exec_latency(url, args.api_key, args.image, args.latency_samples))
        report["workload"] = asyncio.run(workload(url, args.api_key, args.image, args.sandboxes,
                                                  args.execs_per_sandbox, args.concurrency))
        report.update(idle_memory(url, args.api_key, args.image))
        if service is not None:
            report["service_peak_rss_mib"] = round(service.peak_rss() / 2**20, 1)
        if not args.no_baseline:
            report["baseline"] = base = podman_baseline(min(args.latency_samples, 50), min(args.sandboxes, 50),
                                                        args.execs_per_sandbox)
            if "podman_exec_true_ms" in base:
                report["ratios"] = {
                    "exec_true_p50_podman_over_orchard": _ratio(base["podman_exec_true_ms"]["p50"],
                                                                report["exec_true_ms"]["p50"]),
                    "commands_per_s_orchard_over_podman": _ratio(report["workload"]["commands_per_s"],
                                                                 base["commands_per_s"]),
                    "create_p50_podman_over_orchard": _ratio(base["create_ms"]["p50"],
                                                             report["create_ready_ms"]["p50"])}
    print(json.dumps(report, indent=None if args.json else 2))
    return 1 if report["workload"]["failures"] else 0
