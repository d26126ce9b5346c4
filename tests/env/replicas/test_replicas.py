"""Two replicas of `orchard env serve --store redis` on one host and one state dir, behind no balancer:
the client alternates between them. A real redis-server (AOF, fsync always) holds the state."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import pytest

from orchard.env.runner import ServiceProcess

from ..redis_server import RedisServer, need_redis

LEASE = 1.0


class Cluster:
    """redis-server plus replicas a and b sharing it and one state dir."""

    def __init__(self, tmp_path: Path):
        self.redis = RedisServer(tmp_path / "redis").start()
        self.state = tmp_path / "state"
        env = {"ORCHARD_LEASE_SECONDS": str(LEASE), "ORCHARD_RECONCILE_INTERVAL": "0.5",
               "ORCHARD_CREATE_REPLY_WAIT": "0", "ORCHARD_DEFAULT_MEMORY": "512Mi",
               "ORCHARD_DEFAULT_DISK": "256Mi", "ORCHARD_DEFAULT_PIDS": "256"}
        self.a = ServiceProcess(self.state, env={**env, "ORCHARD_STORE": "redis", "ORCHARD_REDIS_URL": self.redis.url,
                                                 "ORCHARD_REPLICA_ID": "a"})
        self.b = ServiceProcess(self.state, env={**env, "ORCHARD_REPLICA_ID": "b"},
                                args=["--no-auth", "--store", "redis", "--redis-url", self.redis.url])
        self.a.log_path, self.b.log_path = tmp_path / "a.log", tmp_path / "b.log"
        self.a.start()
        self.b.start()
        self.http_a = httpx.Client(base_url=self.a.url, timeout=30)
        self.http_b = httpx.Client(base_url=self.b.url, timeout=30)
        self.sandboxes: list[str] = []

    def create(self) -> str:
        sid = self.http_a.post("/sandboxes", json={"image": "host"}).json()["sandbox_id"]
        self.sandboxes.append(sid)
        return sid

    def close(self) -> None:
        for sid in self.sandboxes:
            for http in (self.http_b, self.http_a):
                try:
                    http.delete(f"/sandboxes/{sid}")
                    break
                except httpx.HTTPError:
                    continue
        deadline = time.monotonic() + 15          # teardown runs in the background: let it finish
        while any((self.state / "sandboxes" / sid).exists() for sid in self.sandboxes) and time.monotonic() < deadline:
            time.sleep(0.1)
        for client in (self.http_a, self.http_b):
            client.close()
        self.a.stop()
        self.b.stop()
        self.redis.kill()


@pytest.fixture
def cluster(tmp_path):
    need_redis()
    made = Cluster(tmp_path)
    yield made
    made.close()


def _exec(http: httpx.Client, sid: str, command: str, **kw) -> dict:
    reply = http.post(f"/sandboxes/{sid}/exec", json={"command": command, **kw})
    assert reply.status_code == 200, reply.text
    return reply.json()


def _until(check, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} not met within {timeout}s")


def test_each_replica_serves_what_the_other_started(cluster):
    sid = cluster.create()
    started = time.monotonic()
    info = cluster.http_b.get(f"/sandboxes/{sid}/wait", params={"timeout": 30}).json()     # created on a
    assert info["status"] == "ready" and time.monotonic() - started < 3.0       # woken, not found by polling
    assert _exec(cluster.http_b, sid, "echo from-b > /tmp/f; echo hi", wait=True)["stdout"] == "hi\n"
    assert _exec(cluster.http_a, sid, "cat /tmp/f", wait=True)["stdout"] == "from-b\n"
    assert [s["sandbox_id"] for s in cluster.http_b.get("/sandboxes").json()["sandboxes"]] == [sid]

    job = _exec(cluster.http_b, sid, "sleep 0.6; echo done")["job_id"]
    _until(lambda: cluster.http_a.get(f"/jobs/{job}").json()["status"] == "running", what="running seen on a")
    started = time.monotonic()
    done = cluster.http_a.get(f"/jobs/{job}/wait", params={"timeout": 30}).json()             # submitted on b
    assert done["status"] == "succeeded" and done["stdout"] == "done\n"
    assert time.monotonic() - started < 2.0                                    # a pub/sub wake-up, not the recheck

    key = {"Idempotency-Key": "once"}
    first = cluster.http_a.post(f"/sandboxes/{sid}/exec", json={"command": "echo x"}, headers=key).json()
    again = cluster.http_b.post(f"/sandboxes/{sid}/exec", json={"command": "echo x"}, headers=key).json()
    assert first["job_id"] == again["job_id"]

    assert cluster.http_b.delete(f"/sandboxes/{sid}").status_code == 200
    assert cluster.http_a.get(f"/sandboxes/{sid}").status_code == 404
    _until(lambda: not (cluster.state / "sandboxes" / sid).exists(), what="teardown")


def test_execs_on_one_sandbox_stay_serialised_across_replicas(cluster):
    sid = cluster.create()
    cluster.http_b.get(f"/sandboxes/{sid}/wait", params={"timeout": 30})
    replicas = [cluster.http_a, cluster.http_b]
    jobs = [_exec(replicas[i % 2], sid, "date +%s.%N; sleep 0.2; date +%s.%N")["job_id"] for i in range(6)]
    spans = []
    for i, job in enumerate(jobs):
        result = replicas[(i + 1) % 2].get(f"/jobs/{job}/wait", params={"timeout": 30}).json()
        assert result["status"] == "succeeded", result
        start, end = map(float, result["stdout"].split())
        spans.append((start, end))
    assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:])), spans   # no overlap, in order


def test_a_replica_killed_mid_job(cluster):
    sid = cluster.create()
    cluster.http_b.get(f"/sandboxes/{sid}/wait", params={"timeout": 30})
    reported = _exec(cluster.http_a, sid, "echo reported", wait=True)
    assert reported["stdout"] == "reported\n"
    long = _exec(cluster.http_a, sid, "sleep 30")["job_id"]
    _until(lambda: cluster.http_b.get(f"/jobs/{long}").json()["status"] == "running", what="running seen on b")
    behind = _exec(cluster.http_b, sid, "echo after")["job_id"]             # queued behind a's job

    cluster.a.kill()
    killed = time.monotonic()
    lost = cluster.http_b.get(f"/jobs/{long}/wait", params={"timeout": 30}).json()
    assert lost["status"] == "failed" and "Replica a died" in lost["error"], lost
    assert time.monotonic() - killed < 3 * LEASE + 3
    after = cluster.http_b.get(f"/jobs/{behind}/wait", params={"timeout": 30}).json()
    assert after["status"] == "succeeded" and after["stdout"] == "after\n"  # a's exec lease ran out
    assert cluster.http_b.get(f"/jobs/{reported['job_id']}").json()["stdout"] == "reported\n"
    assert cluster.http_b.get(f"/sandboxes/{sid}").json()["status"] == "ready"


def test_losing_redis_is_503_and_deletes_nothing(cluster):
    sid = cluster.create()
    cluster.http_b.get(f"/sandboxes/{sid}/wait", params={"timeout": 30})
    _exec(cluster.http_a, sid, "echo kept > /tmp/f", wait=True)
    meta = json.loads((cluster.state / "sandboxes" / sid / "meta.json").read_text())

    cluster.redis.kill()
    for http in (cluster.http_a, cluster.http_b):
        reply = http.get(f"/sandboxes/{sid}")
        assert reply.status_code == 503 and reply.headers["retry-after"], reply.text
        assert reply.json()["error"] == "StoreUnavailableError"
        assert http.post(f"/sandboxes/{sid}/exec", json={"command": "true"}).status_code == 503
    assert cluster.http_a.get("/health").status_code == 200
    time.sleep(2.0)                                       # four lifecycle passes on each replica: all skipped
    assert os.path.exists(f"/proc/{meta['pid']}") and (cluster.state / "sandboxes" / sid).exists()

    cluster.redis = RedisServer(cluster.redis.data_dir, port=cluster.redis.port).start()     # back, with its AOF
    _until(lambda: cluster.http_b.get(f"/sandboxes/{sid}").status_code == 200, what="service restored")
    assert cluster.http_b.get(f"/sandboxes/{sid}").json()["status"] == "ready"
    assert _exec(cluster.http_a, sid, "cat /tmp/f", wait=True)["stdout"] == "kept\n"
    assert _exec(cluster.http_b, sid, "cat /tmp/f", wait=True)["stdout"] == "kept\n"
