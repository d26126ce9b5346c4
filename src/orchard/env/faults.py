"""Fault runs: SIGKILL mid-load, sandboxes killed from outside, disconnecting clients, delete races, timeouts.

Each check starts its own service on a fresh state dir, drives it, and returns
{"check": name, "ok": bool, ...figures}. `orchard env stress --mode faults` runs them all;
tests/env/faults runs them as tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Callable, Optional

import httpx

from orchard.env.doctor import settled_leaks
from orchard.env.runner import ServiceProcess

FAST = {"ORCHARD_RECONCILE_INTERVAL": "0.5", "ORCHARD_RECONCILE_MIN_AGE": "0"}


def _http(svc: ServiceProcess) -> httpx.Client:
    return httpx.Client(base_url=svc.url, timeout=60)


def _create(http: httpx.Client, n: int, **body) -> list[str]:
    ids = [http.post("/sandboxes", json={"image": "host", **body}).json()["sandbox_id"] for _ in range(n)]
    for sid in ids:
        http.get(f"/sandboxes/{sid}/wait", params={"timeout": 60})
    return ids


def _leaks(svc: ServiceProcess, settle: float = 10.0) -> list[str]:
    return settled_leaks(svc.state_dir, settle)


def _delete_all(http: httpx.Client) -> None:
    for sb in http.get("/sandboxes").json()["sandboxes"]:
        http.delete(f"/sandboxes/{sb['sandbox_id']}")


# ---------------------------------------------------------------- SIGKILL under load
def sigkill_under_load(commands: int = 200, sandboxes: int = 20) -> dict:
    """SIGKILL the service while `commands` execs are queued or running; restart; nothing may be lost."""
    first = svc = ServiceProcess(args=["--no-auth"], env=FAST).start()
    try:
        with _http(svc) as http:
            ids = _create(http, sandboxes)
            jobs = [http.post(f"/sandboxes/{ids[i % sandboxes]}/exec",
                              json={"command": f"sleep 0.{i % 4}; echo job-{i}"}).json()["job_id"]
                    for i in range(commands)]
            time.sleep(0.5)
            seen = {j: http.get(f"/jobs/{j}").json() for j in jobs}
            reported = {j: body for j, body in seen.items() if body["status"] in ("succeeded", "failed")}
            svc.kill()
            svc = ServiceProcess(state_dir=svc.state_dir, port=svc.port, args=["--no-auth"], env=FAST).start()
            after = {j: http.get(f"/jobs/{j}").json() for j in jobs}
            lost = [j for j, body in reported.items() if after[j] != body]
            stuck = [j for j, body in after.items() if body["status"] in ("queued", "running")]
            unclear = [j for j, body in after.items()
                       if body["status"] == "failed" and j not in reported and "restarted" not in (body["error"] or "")]
            usable = sum(http.post(f"/sandboxes/{sid}/exec", json={"command": "echo ok", "wait": True}).json()
                         .get("stdout") == "ok\n" for sid in ids)
            _delete_all(http)
        leaks = _leaks(svc)
        return {"check": "sigkill_under_load", "commands": commands, "reported_before_kill": len(reported),
                "failed_by_restart": sum("restarted" in (b["error"] or "") for b in after.values()),
                "results_lost": len(lost), "left_running": len(stuck), "unclear_failures": len(unclear),
                "sandboxes_usable_after": f"{usable}/{sandboxes}", "leaks": leaks,
                "ok": not lost and not stuck and not unclear and usable == sandboxes and not leaks}
    finally:
        svc.stop()
        first.__exit__(None, None, None)      # removes the state dir both runs shared


# ---------------------------------------------------------------- killed from outside
def killed_from_outside() -> dict:
    """Kill a sandbox's init from the host: reported failed, execs 404, nothing left behind."""
    with ServiceProcess(args=["--no-auth"], env=FAST) as svc, _http(svc) as http:
        sid = _create(http, 1)[0]
        meta = json.loads((Path(svc.state_dir) / "sandboxes" / sid / "meta.json").read_text())
        os.kill(meta["pid"], signal.SIGKILL)
        info = _poll(lambda: http.get(f"/sandboxes/{sid}").json(), lambda i: i["status"] == "failed")
        exec_status = http.post(f"/sandboxes/{sid}/exec", json={"command": "true"}).status_code
        leaks = _leaks(svc)
        return {"check": "killed_from_outside", "status": info["status"], "message": info["status_message"],
                "exec_status": exec_status, "leaks": leaks,
                "ok": info["status"] == "failed" and exec_status == 404 and not leaks}


def _poll(get: Callable[[], dict], done: Callable[[dict], bool], timeout: float = 15.0) -> dict:
    deadline = time.monotonic() + timeout
    value = get()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(0.1)
        value = get()
    return value


# ---------------------------------------------------------------- disconnecting clients
def disconnects() -> dict:
    """Clients that vanish during /jobs/{id}/wait and during a PTY session leave no process behind."""
    with ServiceProcess(args=["--no-auth"], env=FAST) as svc, _http(svc) as http:
        sid = _create(http, 1)[0]
        job = http.post(f"/sandboxes/{sid}/exec", json={"command": "sleep 1; echo done"}).json()["job_id"]
        try:
            httpx.get(f"{svc.url}/jobs/{job}/wait", params={"timeout": 30}, timeout=0.2)
        except httpx.TimeoutException:
            pass                                        # the client gave up and closed its connection
        finished = http.get(f"/jobs/{job}/wait", params={"timeout": 30}).json()
        asyncio.run(_pty_and_vanish(svc.url, sid))
        left = _poll(lambda: http.post(f"/sandboxes/{sid}/exec", json={"command": "ps -eo args", "wait": True}).json(),
                     lambda j: "sleep 987" not in j["stdout"], timeout=10)
        http.delete(f"/sandboxes/{sid}")
        leaks = _leaks(svc)
        ok = finished["stdout"] == "done\n" and "sleep 987" not in left["stdout"] and not leaks
        return {"check": "client_disconnects", "job_after_wait_disconnect": finished["status"],
                "pty_process_left": "sleep 987" in left["stdout"], "leaks": leaks, "ok": ok}


async def _pty_and_vanish(url: str, sid: str) -> None:
    import websockets

    ws = await websockets.connect(url.replace("http", "ws") + f"/sandboxes/{sid}/exec/pty")
    await ws.send(json.dumps({"type": "init", "cmd": ["sleep", "987"]}))
    await ws.recv()
    ws.transport.abort()                                # vanish without a close frame


# ---------------------------------------------------------------- delete races
async def _race(url: str, rounds: int) -> list[int]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        async def create_delete() -> list[int]:
            r = await http.post("/sandboxes", json={"image": "host"})
            sid = r.json()["sandbox_id"]
            d, e = await asyncio.gather(http.delete(f"/sandboxes/{sid}"),
                                        http.post(f"/sandboxes/{sid}/exec", json={"command": "true", "wait": True}))
            return [r.status_code, d.status_code, e.status_code]

        async def exec_delete() -> list[int]:
            sid = (await http.post("/sandboxes", json={"image": "host"})).json()["sandbox_id"]
            await http.get(f"/sandboxes/{sid}/wait", params={"timeout": 60})
            e, d = await asyncio.gather(http.post(f"/sandboxes/{sid}/exec", json={"command": "sleep 1", "wait": True}),
                                        http.delete(f"/sandboxes/{sid}"))
            return [e.status_code, d.status_code]

        codes = await asyncio.gather(*(create_delete() for _ in range(rounds)), *(exec_delete() for _ in range(rounds)))
    return [c for group in codes for c in group]


def delete_races(rounds: int = 50) -> dict:
    """Delete racing create and exec: only 200/404 answers, no orphan."""
    with ServiceProcess(args=["--no-auth"], env=FAST) as svc:
        codes = asyncio.run(_race(svc.url, rounds))
        leaks = _leaks(svc)
        unexpected = sorted({c for c in codes if c not in (200, 404)})
        return {"check": "delete_races", "rounds": rounds, "answers": {c: codes.count(c) for c in set(codes)},
                "unexpected_statuses": unexpected, "leaks": leaks, "ok": not unexpected and not leaks}


# ---------------------------------------------------------------- timeouts under load
def timeouts_under_load(n: int = 30) -> dict:
    """TTL, heartbeat and readiness timeouts fire while the service is busy."""
    env = {**FAST, "ORCHARD_HEARTBEAT_TIMEOUT": "2", "ORCHARD_CREATE_CONCURRENCY": "1"}
    with ServiceProcess(args=["--no-auth"], env=env) as svc, _http(svc) as http:
        ttl = _create(http, n, ttl_seconds=2)
        beating = _create(http, n)
        for sid in beating:
            http.post(f"/sandboxes/{sid}/heartbeat")
        busy = [http.post(f"/sandboxes/{sid}/exec", json={"command": "sleep 2"}) for sid in beating]
        slow = [http.post("/sandboxes", json={"image": "host", "timeout": 1}).json()["sandbox_id"] for _ in range(n)]
        time.sleep(6)
        gone = lambda ids: sum(http.get(f"/sandboxes/{s}").status_code == 404 for s in ids)  # noqa: E731
        statuses = [http.get(f"/sandboxes/{s}").json().get("status", "gone") for s in slow]
        _delete_all(http)
        leaks = _leaks(svc)
        settled = sum(s in ("ready", "failed", "gone") for s in statuses)
        result = {"check": "timeouts_under_load", "ttl_expired": f"{gone(ttl)}/{n}",
                  "heartbeat_expired": f"{gone(beating)}/{n}", "busy_execs": len(busy),
                  "readiness_settled": f"{settled}/{n}", "leaks": leaks}
        result["ok"] = gone(ttl) == n and gone(beating) == n and settled == n and not leaks
        return result


CHECKS = {"sigkill_under_load": sigkill_under_load, "killed_from_outside": killed_from_outside,
          "client_disconnects": disconnects, "delete_races": delete_races, "timeouts_under_load": timeouts_under_load}


def run_faults(args: Optional[argparse.Namespace] = None) -> dict:
    """Every check; `lost` and `failures` summarise for the stress command's exit code."""
    commands = getattr(args, "fault_commands", 200)
    results = [sigkill_under_load(commands)] + [check() for name, check in CHECKS.items() if name != "sigkill_under_load"]
    return {"mode": "faults", "checks": results, "failures": sum(not r["ok"] for r in results),
            "lost": sum(r.get("results_lost", 0) for r in results)}
