"""`orchard env doctor` beyond the local backend: records from SQLite or a real Redis, containers listed
through a real Podman API service, young sandboxes left alone, and `--fix` removing leaks."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid

import pytest

from orchard.env import doctor
from orchard.env.backends.base import LiveSandbox, SandboxSpec
from orchard.env.service.records import SandboxRecord
from orchard.env.service.stores import SqliteStore
from orchard.env.settings import Settings
from tests.env.podman_api import Engine, podman_engine
from tests.env.redis_server import RedisServer, need_redis


def record(sid: str, status: str) -> SandboxRecord:
    now = time.time()
    return SandboxRecord(sandbox_id=sid, owner="", namespace="default", image="host", status=status,
                         created_at=now, expires_at=now + 600)


async def put_records(store, records: list[SandboxRecord]) -> None:
    await store.open()
    try:
        for r in records:
            await store.put_sandbox(r, create=True)
    finally:
        await store.close()


def doctor_args(**given) -> argparse.Namespace:
    base = {"state_dir": None, "backend": None, "store": None, "redis_url": None, "min_age": None, "fix": False}
    return argparse.Namespace(**{**base, **given})


def run_doctor(capsys, **given) -> tuple[int, dict]:
    rc = doctor.main(doctor_args(**given))
    return rc, json.loads(capsys.readouterr().out)


def test_sort_live_sets_owned_young_and_leaked_apart():
    now = 1000.0
    live = [LiveSandbox("owned", 0.0), LiveSandbox("young", now - 5), LiveSandbox("orphan", 0.0),
            LiveSandbox("failed", 0.0, alive=False)]
    records = {"owned": "ready", "failed": "failed", "young": "deleted"}
    leaks, young = doctor.sort_live(live, records, 60.0, "container", now)
    assert young == ["young"]
    assert [leak.describe() for leak in leaks] == ["failed: container (record is failed, not running)",
                                                    "orphan: container (no record)"]


def test_redis_without_url_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ORCHARD_REDIS_URL", raising=False)
    assert doctor.main(doctor_args(state_dir=str(tmp_path), store="redis")) == 2
    assert "store=redis needs redis_url" in capsys.readouterr().err


def test_records_come_from_a_real_redis(tmp_path):
    need_redis()
    from orchard.env.service.stores.redis import RedisStore
    with RedisServer(tmp_path / "redis") as server:
        asyncio.run(put_records(RedisStore(server.url, prefix="doc"), [record("a", "ready"), record("b", "failed")]))
        settings = doctor.doctor_settings(doctor_args(state_dir=str(tmp_path), store="redis", redis_url=server.url))
        assert doctor.store_records(settings) == {}          # another deployment's prefix: nothing of ours
        settings = settings.model_copy(update={"redis_prefix": "doc"})
        assert doctor.store_records(settings) == {"a": "ready", "b": "failed"}


# ---------------------------------------------------------------- container backend on Podman
@pytest.fixture(scope="module")
def engine() -> Engine:
    yield from podman_engine()


async def start_sandboxes(settings: Settings, ids: list[str]) -> None:
    from orchard.env.backends.container import ContainerBackend
    backend = ContainerBackend(settings)
    await backend.start(doctor._noop_exit)
    try:
        for sid in ids:
            await backend.create(SandboxSpec(sandbox_id=sid, image="host", created_at=time.time()))
    finally:
        await backend.close()


async def listed(settings: Settings) -> list[str]:
    from orchard.env.backends.container import ContainerBackend
    backend = ContainerBackend(settings)
    await backend.start(doctor._noop_exit)
    try:
        return sorted(sb.sandbox_id for sb in await backend.list_live() or [])
    finally:
        await backend.close()


@pytest.fixture(params=["sqlite", "redis"])
def store_env(request, tmp_path, monkeypatch):
    """The store named through ORCHARD_* variables, as an operator's deployment would; a real redis-server."""
    monkeypatch.setenv("ORCHARD_STORE", request.param)
    if request.param == "sqlite":
        yield lambda settings: SqliteStore(settings.sqlite_path())
        return
    need_redis()
    from orchard.env.service.stores.redis import RedisStore
    with RedisServer(tmp_path / "redis") as server:
        monkeypatch.setenv("ORCHARD_REDIS_URL", server.url)
        yield lambda settings: RedisStore(server.url, prefix=settings.redis_prefix)


def test_container_leak_found_and_fixed(engine, store_env, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ORCHARD_DOCKER_HOST", engine.url)
    monkeypatch.setenv("ORCHARD_NAMESPACE", engine.namespace)
    settings = Settings(backend="container", state_dir=tmp_path)
    live, orphan = f"live-{uuid.uuid4().hex[:6]}", f"orphan-{uuid.uuid4().hex[:6]}"
    asyncio.run(start_sandboxes(settings, [live, orphan]))
    asyncio.run(put_records(store_env(settings), [record(live, "ready")]))
    given = {"state_dir": str(tmp_path), "backend": "container"}

    rc, report = run_doctor(capsys, **given, min_age=3600)          # just created: maybe still being set up
    assert (rc, report["leaks"], report["young"]) == (0, [], [orphan])
    assert "being created" in report["min_age"]

    rc, report = run_doctor(capsys, **given, min_age=0)
    assert (rc, report["leaks"], report["young"]) == (1, [f"{orphan}: container (no record)"], [])
    assert (report["store"], report["records"]) == (settings.store, 1)

    rc, report = run_doctor(capsys, **given, min_age=0, fix=True)
    assert (rc, report["fixed"], report["remaining"]) == (0, True, [])
    assert asyncio.run(listed(settings)) == [live]


# ---------------------------------------------------------------- Kubernetes backend on the fake cluster
def test_kubernetes_old_orphan_pod_found_and_fixed(tmp_path, capsys, monkeypatch):
    from tests.env.backends.test_kubernetes import Cluster
    from tests.env.kube_fake import skip_without_bwrap
    skip_without_bwrap()
    cluster = Cluster(tmp_path)
    try:
        monkeypatch.setenv("ORCHARD_KUBE_CONFIG", str(cluster.kubeconfig))
        settings = Settings(backend="kubernetes", state_dir=tmp_path / "state")
        asyncio.run(plant_pods(settings))
        asyncio.run(put_records(SqliteStore(settings.sqlite_path()), [record("owned", "ready")]))
        given = {"state_dir": str(settings.state_dir), "backend": "kubernetes", "min_age": 600}

        rc, report = run_doctor(capsys, **given)
        assert (rc, report["leaks"], report["young"]) == (1, ["old-orphan: pod (no record)"], ["young-orphan"])

        rc, report = run_doctor(capsys, **given, fix=True)
        assert (rc, report["fixed"], report["remaining"]) == (0, True, [])
        rc, report = run_doctor(capsys, **given)
        assert (rc, report["leaks"], report["young"]) == (0, [], ["young-orphan"])
    finally:
        cluster.stop()


async def plant_pods(settings: Settings) -> None:
    from orchard.env.backends.kubernetes import KubernetesBackend
    backend = KubernetesBackend(settings)
    await backend.start(doctor._noop_exit)
    try:
        await backend.create(SandboxSpec("owned", "host", created_at=time.time() - 3600))
        await backend.create(SandboxSpec("old-orphan", "host", created_at=time.time() - 3600))
        await backend.create(SandboxSpec("young-orphan", "host", created_at=time.time()))
    finally:
        await backend.close()


# ---------------------------------------------------------------- local backend, records in Redis
def test_local_leak_with_records_in_redis(tmp_path, capsys):
    """The local host checks keep working when the records live in Redis: owned is left, the orphan removed."""
    from tests.env.kube_fake import skip_without_bwrap
    skip_without_bwrap()
    need_redis()
    from orchard.env.backends.local import LocalBackend
    from orchard.env.service.stores.redis import RedisStore
    with RedisServer(tmp_path / "redis") as server:
        settings = Settings(backend="local", state_dir=tmp_path / "state", store="redis", redis_url=server.url)
        asyncio.run(plant_local(LocalBackend(settings), ["owned", "orphan"]))
        try:
            asyncio.run(put_records(RedisStore(server.url, prefix=settings.redis_prefix), [record("owned", "ready")]))
            given = {"state_dir": str(settings.state_dir), "backend": "local", "store": "redis",
                     "redis_url": server.url}
            rc, report = run_doctor(capsys, **given)
            assert rc == 1 and [leak.split(":")[0] for leak in report["leaks"]] == ["orphan"]
            rc, report = run_doctor(capsys, **given, fix=True)
            assert (rc, report["remaining"]) == (0, [])
            assert sorted(LocalBackend(settings).inventory()) == ["owned"]
        finally:
            for sid in ("owned", "orphan"):
                asyncio.run(LocalBackend(settings).delete(sid))


async def plant_local(backend, ids: list[str]) -> None:
    await backend.start(doctor._noop_exit)
    try:
        for sid in ids:
            await backend.create(SandboxSpec(sid, "host", created_at=time.time()))
    finally:
        await backend.close()
