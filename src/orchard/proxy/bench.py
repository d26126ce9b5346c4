"""`orchard proxy bench`: the latency the proxy adds, its throughput at many concurrent sessions against direct calls,
and the CPU time per call of the proxy and of the upstream (the figure that does not depend on the machine's load)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import httpx

ADMIN = "bench-admin"
BODIES = {
    "openai_chat": ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "Say ok."}]}),
    "openai_responses": ("/v1/responses", {"model": "m", "input": "Say ok."}),
    "anthropic_messages": ("/v1/messages", {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "Say ok."}]}),
}


def _body(dialect: str, history_kb: int) -> tuple[str, dict[str, Any]]:
    """The dialect's path and body: a short question after ``history_kb`` 1 KB turns of earlier conversation (an
    agent's later calls resend tens to hundreds of KB, and their prompt token ids come back with each reply)."""
    path, body = BODIES[dialect]
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: " + "lorem ipsum " * 84}
             for i in range(history_kb - history_kb % 2)]
    key = "input" if dialect == "openai_responses" else "messages"
    last = [{"role": "user", "content": body[key]}] if isinstance(body[key], str) else body[key]
    return path, {**body, key: turns + last}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Server:
    """A bench server process: where it answers, and how much CPU it has used."""

    def __init__(self, url: str, pid: int | None):
        self.url, self.pid = url, pid

    def cpu_seconds(self) -> float:
        """User + system CPU time of the process so far (0 for a server this bench did not start)."""
        if self.pid is None:
            return 0.0
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def _process(args: list[str], port: int) -> Iterator[_Server]:
    """Run one server (this module's child entry points) and wait until it answers /health."""
    proc = subprocess.Popen([sys.executable, "-m", "orchard.proxy.bench", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc)
        yield _Server(url, proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _wait_healthy(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"a bench server exited: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not become healthy")


async def _calls(client: Any, url: str, body: dict[str, Any], key: str | None, n: int) -> list[float]:
    headers = {"Authorization": f"Bearer {key}", "content-type": "application/json"} if key else {"content-type": "application/json"}
    data, times = json.dumps(body).encode(), []
    for _ in range(n):
        started = time.perf_counter()
        async with client.post(url, data=data, headers=headers) as response:
            text = await response.read()
        times.append(time.perf_counter() - started)
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}: {text[:300]!r}")
    return times


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def _latency(client: Any, direct: str, proxied: str, key: str, body_direct: dict, body: dict, n: int) -> dict[str, Any]:
    """Sequential calls, direct and through the proxy interleaved in blocks so load drifts hit both alike."""
    d, p = [], []
    await _calls(client, direct, body_direct, None, 20)
    await _calls(client, proxied, body, key, 20)
    for _ in range(10):
        d += await _calls(client, direct, body_direct, None, n // 10)
        p += await _calls(client, proxied, body, key, n // 10)
    out = {"direct_p50_ms": _percentile(d, 0.5), "direct_p99_ms": _percentile(d, 0.99),
           "proxy_p50_ms": _percentile(p, 0.5), "proxy_p99_ms": _percentile(p, 0.99)}
    out["added_p50_ms"] = out["proxy_p50_ms"] - out["direct_p50_ms"]
    out["added_p99_ms"] = out["proxy_p99_ms"] - out["direct_p99_ms"]
    return out


async def _throughput(client: Any, url: str, body: dict, keys: list[str | None], per_session: int) -> float:
    started = time.perf_counter()
    await asyncio.gather(*(_calls(client, url, body, key, per_session) for key in keys))
    return len(keys) * per_session / (time.perf_counter() - started)


async def _open_sessions(client: Any, proxy: str, n: int) -> list[str]:
    keys = []
    for _ in range(n):
        async with client.post(proxy + "/sessions", json={}, headers={"Authorization": f"Bearer {ADMIN}"}) as response:
            keys.append((await response.json())["key"])
    return keys


async def _measure(args: argparse.Namespace, upstream: _Server, proxy: _Server) -> dict[str, Any]:
    import aiohttp  # the load generator must outrun the proxy: httpx's pool is too slow at 64 concurrent calls

    path, body = _body(args.dialect, args.history_kb)
    direct_body, direct_url = _body("openai_chat", args.history_kb)[1], upstream.url + "/v1/chat/completions"
    # idle connections are dropped before the servers' 5 s keep-alive ends, so none is reused as the server closes it
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=512, keepalive_timeout=4)) as client:
        keys = await _open_sessions(client, proxy.url, args.sessions)
        result = await _latency(client, direct_url, proxy.url + path, keys[0], direct_body, body, args.latency_calls)
        direct_rates, proxy_rates, proxy_cpu, upstream_cpu = [], [], 0.0, 0.0
        for _ in range(2):  # alternate, and keep the better of two runs each, to damp a shared machine's noise
            cpu = upstream.cpu_seconds()
            direct_rates.append(await _throughput(client, direct_url, direct_body, [None] * args.sessions, args.calls_per_session))
            upstream_cpu += upstream.cpu_seconds() - cpu
            cpu = proxy.cpu_seconds()
            proxy_rates.append(await _throughput(client, proxy.url + path, body, keys, args.calls_per_session))
            proxy_cpu += proxy.cpu_seconds() - cpu
    calls = 2 * args.sessions * args.calls_per_session
    result |= {"direct_calls_per_s": max(direct_rates), "proxy_calls_per_s": max(proxy_rates)}
    result["throughput_ratio"] = result["proxy_calls_per_s"] / result["direct_calls_per_s"]
    return result | _cpu_figures(proxy_cpu * 1000 / calls, upstream_cpu * 1000 / calls if upstream.pid else None)


def _cpu_figures(proxy_ms: float, upstream_ms: Optional[float]) -> dict[str, Any]:
    """CPU per call, and what it implies whatever the load: ``cpu_bound_ratio`` is the throughput through the proxy
    relative to direct calls when proxy and upstream share the same busy cores (upstream / (upstream + proxy))."""
    out: dict[str, Any] = {"proxy_cpu_ms_per_call": proxy_ms, "upstream_cpu_ms_per_call": upstream_ms,
                           "proxy_to_upstream_cpu": None, "cpu_bound_ratio": None}
    if upstream_ms:
        out["proxy_to_upstream_cpu"] = proxy_ms / upstream_ms
        out["cpu_bound_ratio"] = upstream_ms / (upstream_ms + proxy_ms)
    return out


@contextmanager
def _upstream(args: argparse.Namespace, delay_ms: float) -> Iterator[_Server]:
    if args.upstream:
        yield _Server(args.upstream.rstrip("/").removesuffix("/v1"), None)
        return
    port = _free_port()
    with _process(["upstream", str(port), str(delay_ms)], port) as server:
        yield server


def main(args: argparse.Namespace) -> int:
    """One measurement per upstream delay (the fake's; a given ``--upstream`` is measured once), fresh processes each."""
    delays = [0.0] if args.upstream else list(dict.fromkeys(args.upstream_delay_ms))
    results = [_run(args, delay) for delay in delays]
    print(json.dumps(results, indent=2) if args.json else "\n\n".join(_table(r) for r in results))
    return 0


def _run(args: argparse.Namespace, delay_ms: float) -> dict[str, Any]:
    proxy_port = _free_port()
    with tempfile.TemporaryDirectory(prefix="orchard-proxy-bench-") as store:
        with _upstream(args, delay_ms) as upstream, _process(["proxy", str(proxy_port), upstream.url, store, args.durability], proxy_port) as proxy:
            result = asyncio.run(_measure(args, upstream, proxy))
    return result | {"dialect": args.dialect, "durability": args.durability, "sessions": args.sessions,
                     "history_kb": args.history_kb,
                     "upstream": args.upstream or "fake (in-package, byte tokens)",
                     "upstream_delay_ms": None if args.upstream else delay_ms,
                     "cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]}


def _table(r: dict[str, Any]) -> str:
    return "\n".join([
        f"orchard proxy bench: dialect {r['dialect']}, durability {r['durability']}, upstream {r['upstream']}, "
        f"history {r['history_kb']} KB, "
        f"delay {_ms(r['upstream_delay_ms'], '{:g}')}, "
        f"{r['cpus']} CPUs, load {r['load_avg_1m']:.1f}",
        f"latency (sequential)   direct p50 {r['direct_p50_ms']:.2f} ms  p99 {r['direct_p99_ms']:.2f} ms",
        f"                       proxy  p50 {r['proxy_p50_ms']:.2f} ms  p99 {r['proxy_p99_ms']:.2f} ms",
        f"                       added  p50 {r['added_p50_ms']:.2f} ms  p99 {r['added_p99_ms']:.2f} ms",
        f"throughput ({r['sessions']} sessions)  direct {r['direct_calls_per_s']:.0f} calls/s  proxy {r['proxy_calls_per_s']:.0f} calls/s"
        f"  ratio {r['throughput_ratio']:.2f}",
        f"CPU per call           proxy {r['proxy_cpu_ms_per_call']:.3f} ms (one core: {1000 / max(r['proxy_cpu_ms_per_call'], 1e-9):.0f}"
        f" calls/s), upstream {_ms(r['upstream_cpu_ms_per_call'], '{:.3f}')}; proxy/upstream {_num(r['proxy_to_upstream_cpu'])}",
        f"CPU-bound ratio        {_num(r['cpu_bound_ratio'])} (proxy vs direct throughput when both share busy cores:"
        f" upstream / (upstream + proxy) CPU); unlike the rates, the CPU figures do not depend on the machine's load",
    ])


def _ms(value: float | None, spec: str = "{:.2f}") -> str:
    return "n/a" if value is None else spec.format(value) + " ms"


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _child(argv: list[str]) -> None:
    """Entry point of the bench's servers: ``upstream PORT DELAY_MS`` or ``proxy PORT UPSTREAM STORE DURABILITY``."""
    import uvicorn

    if argv[0] == "upstream":
        from orchard.proxy.fake_upstream import FakeUpstream
        delay = float(argv[2]) / 1000
        app: Any = FakeUpstream(lambda messages, tools: {"content": "ok", "delay": delay}, keep=False)
    else:
        from orchard.proxy.app import ProxySettings, create_app
        app = create_app(ProxySettings(upstream_url=argv[2], store_dir=argv[3], durability=argv[4], admin_keys=[ADMIN]))
    uvicorn.run(app, host="127.0.0.1", port=int(argv[1]), loop="uvloop", http="httptools", log_level="warning",
                access_log=False, timeout_keep_alive=75 if argv[0] == "proxy" else 5)  # as `orchard proxy serve`, as vLLM


if __name__ == "__main__":
    _child(sys.argv[1:])
