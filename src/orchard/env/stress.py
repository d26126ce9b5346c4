"""`orchard env stress`: burst, soak, ramp and fault runs against the service, printing figures."""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from typing import Any, Optional

import httpx

from orchard.client.aio import AsyncSandboxClient
from orchard.env.bench import percentiles
from orchard.env.runner import ServiceProcess


CLIENT_NICE = 10


class HealthProbe:
    """Pings /health every `interval` from a process of its own, so client load never skews the figure."""

    def __init__(self, url: str, interval: float = 0.05):
        self.url, self.interval = url, interval
        self._stop = multiprocessing.get_context("fork").Event()
        self._recv, send = multiprocessing.get_context("fork").Pipe(duplex=False)
        self._proc = multiprocessing.get_context("fork").Process(
            target=_probe, args=(url, interval, self._stop, send), daemon=True)
        self.samples: list[float] = []
        self.errors = 0

    async def __aenter__(self) -> "HealthProbe":
        self._proc.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        self.samples, self.errors = await asyncio.to_thread(self._recv.recv)
        self._proc.join(10)

    def summary(self) -> dict:
        return {"health_ms": percentiles(self.samples), "health_errors": self.errors}


def _probe(url: str, interval: float, stop, send) -> None:
    samples, failures = [], 0
    with httpx.Client(base_url=url, timeout=10) as http:
        while not stop.is_set():
            t = time.perf_counter()
            try:
                http.get("/health").raise_for_status()
                samples.append(time.perf_counter() - t)
            except httpx.HTTPError:
                failures += 1
            time.sleep(interval)
    send.send((samples, failures))


# ---------------------------------------------------------------- burst
async def _lifecycle(client: AsyncSandboxClient, image: str, execs: int, stats: dict) -> None:
    try:
        sb = await client.create_sandbox(image, timeout=600)
        for i in range(execs):
            result = await sb.exec(f"echo {i}")
            stats["commands"] += 1
            if result.exit_code != 0 or result.stdout.strip() != str(i):
                stats["failures"].append(f"exec {i}: {result.status} {result.error}")
        await sb.delete()
        stats["sandboxes"] += 1
    except Exception as e:  # counted, never fatal to the run
        stats["failures"].append(f"{type(e).__name__}: {e}")


async def _burst_part(url: str, key: Optional[str], image: str, sandboxes: int, execs: int) -> dict:
    stats: dict = {"sandboxes": 0, "commands": 0, "failures": []}
    async with AsyncSandboxClient(base_url=url, api_key=key, timeout=900) as client:
        await asyncio.gather(*(_lifecycle(client, image, execs, stats) for _ in range(sandboxes)))
    return stats


def _burst_worker(url: str, key: Optional[str], image: str, sandboxes: int, execs: int) -> dict:
    os.nice(CLIENT_NICE)     # the load generator shares this machine: it must not starve the service it measures
    return asyncio.run(_burst_part(url, key, image, sandboxes, execs))


async def burst(url: str, key: Optional[str], image: str, sandboxes: int, execs: int, workers: int = 8) -> dict:
    """All sandboxes at once (split over `workers` client processes): create, `execs` commands each, delete."""
    shares = [sandboxes // workers + (1 if i < sandboxes % workers else 0) for i in range(workers)]
    loop = asyncio.get_running_loop()
    async with HealthProbe(url) as probe:
        t0 = time.perf_counter()
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            parts = await asyncio.gather(*(loop.run_in_executor(pool, _burst_worker, url, key, image, n, execs)
                                           for n in shares if n))
        wall = time.perf_counter() - t0
    failures = [f for part in parts for f in part["failures"]]
    return {"mode": "burst", "asked": sandboxes, "client_processes": workers,
            "sandboxes_completed": sum(p["sandboxes"] for p in parts),
            "commands": sum(p["commands"] for p in parts), "failures": len(failures),
            "failure_samples": failures[:5], "wall_s": round(wall, 2), **probe.summary()}


# ---------------------------------------------------------------- soak
async def _soaker(client: AsyncSandboxClient, image: str, deadline: float, max_gap: float, stats: dict) -> None:
    try:
        async with await client.create_sandbox(image, timeout=600) as sb:
            n = 0
            while time.monotonic() < deadline:
                result = await sb.exec(f"echo soak-{n}")
                stats["commands"] += 1
                if result.stdout.strip() != f"soak-{n}":
                    stats["failures"].append(f"wrong output {result.stdout!r} {result.error}")
                n += 1
                await sb.heartbeat()
                await asyncio.sleep(random.uniform(0, max_gap))
    except Exception as e:
        stats["failures"].append(f"{type(e).__name__}: {e}")


async def soak(url: str, key: Optional[str], image: str, sandboxes: int, duration: float, max_gap: float) -> dict:
    """Long-lived sandboxes with idle gaps (longer than client keep-alive expiry) between commands."""
    stats: dict = {"commands": 0, "failures": []}
    deadline = time.monotonic() + duration
    async with HealthProbe(url, 0.5) as probe, AsyncSandboxClient(base_url=url, api_key=key) as client:
        await asyncio.gather(*(_soaker(client, image, deadline, max_gap, stats) for _ in range(sandboxes)))
    return {"mode": "soak", "sandboxes": sandboxes, "duration_s": duration, "max_idle_gap_s": max_gap,
            "commands": stats["commands"], "failures": len(stats["failures"]),
            "failure_samples": stats["failures"][:5], **probe.summary()}


# ---------------------------------------------------------------- ramp
async def _ramp_worker(http: httpx.AsyncClient, sid: str, deadline: float, step: dict) -> None:
    while time.monotonic() < deadline:
        t = time.perf_counter()
        r = await http.post(f"/sandboxes/{sid}/exec", json={"command": "true", "wait": True})
        if r.status_code == 503:
            step["rejected"] += 1
            step["retry_after"] = r.headers.get("retry-after")
            await asyncio.sleep(float(r.headers.get("retry-after", "1")))
        elif r.status_code == 200 and r.json().get("status") == "succeeded":
            step["latencies"].append(time.perf_counter() - t)
        else:
            step["errors"] += 1


async def _ramp_part(url: str, key: Optional[str], sids: list[str], workers: int, seconds: float) -> dict:
    step = {"latencies": [], "rejected": 0, "errors": 0, "retry_after": None}
    headers = {"X-API-Key": key} if key else {}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as http:
        deadline = time.monotonic() + seconds
        await asyncio.gather(*(_ramp_worker(http, sids[i % len(sids)], deadline, step) for i in range(workers)))
    return step


def _ramp_process(url: str, key: Optional[str], sids: list[str], workers: int, seconds: float) -> dict:
    os.nice(CLIENT_NICE)
    return asyncio.run(_ramp_part(url, key, sids, workers, seconds))


async def _ramp_step(url: str, key: Optional[str], sids: list[str], concurrency: int, seconds: float) -> dict:
    procs = min(8, concurrency)
    shares = [concurrency // procs + (1 if i < concurrency % procs else 0) for i in range(procs)]
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("fork")) as pool:
        parts = await asyncio.gather(*(loop.run_in_executor(pool, _ramp_process, url, key, sids[i::procs], n, seconds)
                                       for i, n in enumerate(shares)))
    latencies = [x for p in parts for x in p["latencies"]]
    return {"concurrency": concurrency, "ok": len(latencies), "per_s": round(len(latencies) / seconds, 1),
            "latency_ms": percentiles(latencies), "rejected_503": sum(p["rejected"] for p in parts),
            "retry_after": next((p["retry_after"] for p in parts if p["retry_after"]), None),
            "errors": sum(p["errors"] for p in parts)}


async def ramp(url: str, key: Optional[str], image: str, steps: list[int], step_seconds: float) -> dict:
    """Step up concurrent exec clients (one sandbox per 4): throughput, latency and 503s (admission control)."""
    async with AsyncSandboxClient(base_url=url, api_key=key) as client:
        boxes = list(await asyncio.gather(*(client.create_sandbox(image) for _ in range(max(8, max(steps) // 4)))))
        rows = []
        for concurrency in steps:
            sids = [b.sandbox_id for b in boxes[:max(8, concurrency // 4)]]
            rows.append(await _ramp_step(url, key, sids, concurrency, step_seconds))
        await asyncio.gather(*(sb.delete() for sb in boxes))
    first = next((r["concurrency"] for r in rows if r["rejected_503"]), None)
    return {"mode": "ramp", "steps": rows, "first_503_at_concurrency": first,
            "errors": sum(r["errors"] for r in rows)}


# ---------------------------------------------------------------- command
def _service_for(args: argparse.Namespace, stack: ExitStack, env: Optional[dict] = None) -> tuple[str, Any]:
    if args.url:
        return args.url, None
    svc = stack.enter_context(ServiceProcess(args=["--no-auth"], env=env))
    return svc.url, svc


def run_mode(mode: str, args: argparse.Namespace) -> dict:
    """One mode against --url or a fresh local service; adds the service's peak memory when it started one."""
    env = {"ORCHARD_MAX_QUEUED_EXECS": str(args.ramp_queue)} if mode == "ramp" else None
    with ExitStack() as stack:
        url, svc = _service_for(args, stack, env)
        if mode == "burst":
            result = asyncio.run(burst(url, args.api_key, args.image, args.sandboxes, args.execs_per_sandbox))
        elif mode == "soak":
            result = asyncio.run(soak(url, args.api_key, args.image, args.soak_sandboxes, args.duration, args.max_gap))
        elif mode == "ramp":
            result = asyncio.run(ramp(url, args.api_key, args.image, args.steps, args.step_seconds))
            result["exec_queue_limit"] = args.ramp_queue if svc else "as configured"
        else:
            from orchard.env.faults import run_faults
            return run_faults(args)
        if svc is not None:
            result["service_peak_rss_mib"] = round(svc.peak_rss() / 2**20, 1)
            result["leaks"] = _doctor(svc)
    return result


def _doctor(svc: ServiceProcess) -> list[str]:
    from orchard.env.doctor import settled_leaks
    return settled_leaks(svc.state_dir)


def main(args: argparse.Namespace) -> int:
    modes = ["burst", "soak", "ramp", "faults"] if args.mode == "all" else [args.mode]
    results = [run_mode(mode, args) for mode in modes]
    print(json.dumps(results if len(results) > 1 else results[0], indent=None if args.json else 2))
    bad = any(r.get("failures") or r.get("errors") or r.get("leaks") or r.get("lost") for r in results)
    return 1 if bad else 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", choices=["burst", "soak", "ramp", "faults", "all"], default="burst")
    parser.add_argument("--url", help="a running service (default: start one with a fresh state dir)")
    parser.add_argument("--api-key")
    parser.add_argument("--image", default="host")
    parser.add_argument("--sandboxes", type=int, default=1000, help="burst size")
    parser.add_argument("--execs-per-sandbox", type=int, default=4)
    parser.add_argument("--soak-sandboxes", type=int, default=16)
    parser.add_argument("--duration", type=float, default=60.0, help="soak length in seconds")
    parser.add_argument("--max-gap", type=float, default=8.0, help="longest idle gap between soak commands")
    parser.add_argument("--steps", type=lambda s: [int(x) for x in s.split(",")], default=[8, 32, 128, 256, 512])
    parser.add_argument("--step-seconds", type=float, default=4.0)
    parser.add_argument("--ramp-queue", type=int, default=192, help="exec queue bound of the service started for ramp")
    parser.add_argument("--fault-commands", type=int, default=200)
    parser.add_argument("--json", action="store_true")

