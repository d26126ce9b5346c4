"""Both stores keep the same promises (records, jobs, idempotency, wake-ups, exec turns, heartbeats);
the Redis store also across two replicas' connections, under leases, and when Redis is gone."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from orchard import errors
from orchard.env.service.lifecycle import Lifecycle
from orchard.env.service.records import JobRecord, SandboxRecord
from orchard.env.service.stores.sqlite import SqliteStore
from orchard.env.settings import Settings

from ..redis_server import RedisServer, need_redis


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    need_redis()
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


class Stores:
    """Opens stores of one kind; for Redis every store of a test shares a prefix, like replicas would."""

    def __init__(self, kind: str, tmp_path, redis_server):
        self.kind, self.tmp_path, self.redis_server = kind, tmp_path, redis_server
        self.prefix = f"t{uuid.uuid4().hex[:8]}"
        self.opened: list = []

    async def open(self):
        if self.kind == "sqlite":
            store = SqliteStore(self.tmp_path / "db.sqlite")
        else:
            from orchard.env.service.stores.redis import RedisStore
            store = RedisStore(self.redis_server.url, prefix=self.prefix, recheck=0.5)
        await store.open()
        self.opened.append(store)
        return store

    async def close(self, store) -> None:
        self.opened.remove(store)
        await store.close()


@pytest.fixture(params=["sqlite", "redis"])
async def stores(request, tmp_path):
    server = request.getfixturevalue("redis_server") if request.param == "redis" else None
    made = Stores(request.param, tmp_path, server)
    yield made
    for store in list(made.opened):
        await made.close(store)


def _sandbox(sid="s1", owner="o", **kw) -> SandboxRecord:
    now = time.time()
    return SandboxRecord(sandbox_id=sid, owner=owner, namespace="n", image="host", created_at=now,
                         expires_at=now + 60, cpu="1", memory="1Gi", **kw)


def _job(job_id: str, sandbox_id: str = "s1", **kw) -> JobRecord:
    return JobRecord(**{"job_id": job_id, "sandbox_id": sandbox_id, "owner": "o", "command": ["ls"],
                        "created_at": time.time(), **kw})


async def test_roundtrip_and_reopen(stores):
    store = await stores.open()
    assert await store.put_sandbox(_sandbox(model_endpoint=(8000, "127.0.0.1:9")), create=True) is True
    assert await store.put_sandbox(_sandbox(), create=True) is False           # duplicate id
    await store.put_job(_job("j1", status="succeeded", stdout="x" * 300_000, completed_at=time.time(),
                             idempotency_key="k"))
    await store.put_job(_job("j2", command="sleep 9"))
    await store.put_image("o", "snap")
    await stores.close(store)

    again = await stores.open()
    record = await again.get_sandbox("s1")
    assert record.image == "host" and record.model_endpoint == (8000, "127.0.0.1:9")
    assert (await again.get_job("j1")).stdout == "x" * 300_000
    assert (await again.job_by_key("s1", "k")).job_id == "j1"
    assert await again.job_by_key("s1", "other") is None
    assert [j.job_id for j in await again.unfinished_jobs()] == ["j2"]
    assert [r.sandbox_id for r in await again.list_sandboxes("o")] == ["s1"]
    assert await again.list_sandboxes("other") == []
    assert await again.list_images("o") == ["snap"] and await again.list_images("other") == []
    assert await again.prune_jobs(time.time() + 1) == 1
    assert await again.get_job("j1") is None and await again.get_job("j2") is not None
    assert await again.delete_sandbox("s1") is True
    assert await again.delete_sandbox("s1") is False                           # only one caller removes it
    assert await again.get_sandbox("s1") is None and await again.list_sandboxes() == []


async def test_update_changes_only_its_fields_and_never_recreates(stores):
    a, b = await stores.open(), await stores.open() if stores.kind == "redis" else None
    b = b or a
    await a.put_sandbox(_sandbox(), create=True)
    seen = await b.get_sandbox("s1")                   # a heartbeat reads this ...
    await a.update_sandbox("s1", status="ready", ready_at=123.5)
    updated = await b.update_sandbox("s1", last_heartbeat=seen.created_at + 1)   # ... and must not undo "ready"
    assert updated.status == "ready" and updated.ready_at == 123.5 and updated.last_heartbeat == seen.created_at + 1
    assert (await a.get_sandbox("s1")).status == "ready"
    await a.delete_sandbox("s1")
    assert await b.update_sandbox("s1", status="failed") is None
    assert await a.get_sandbox("s1") is None


async def test_one_job_per_idempotency_key(stores):
    replicas = [await stores.open() for _ in range(2 if stores.kind == "redis" else 1)]
    candidates = [_job(f"j{i}", idempotency_key="same") for i in range(6)]
    stored = await asyncio.gather(*(replicas[i % len(replicas)].add_job(job) for i, job in enumerate(candidates)))
    assert len({job.job_id for job in stored}) == 1
    winner = stored[0].job_id
    assert (await replicas[-1].job_by_key("s1", "same")).job_id == winner
    assert [j.job_id for j in await replicas[0].unfinished_jobs()] == [winner]
    assert (await replicas[0].add_job(_job("other-sandbox", sandbox_id="s2", idempotency_key="same"))).job_id == "other-sandbox"
    assert (await replicas[0].add_job(_job("no-key"))).job_id == "no-key"


async def test_notify_wakes_a_waiter_that_took_its_event_first(stores):
    waiter = await stores.open()
    notifier = await stores.open() if stores.kind == "redis" else waiter      # another replica
    ev = waiter.event("job:j1")
    assert not ev.is_set()
    started = time.monotonic()
    await notifier.notify("job:j1")
    await asyncio.wait_for(ev.wait(), 2)
    assert time.monotonic() - started < 1.0
    assert not waiter.event("job:j1").is_set()            # a fresh event for the next change


async def test_turns_serialise_in_join_order(stores):
    replicas = [await stores.open() for _ in range(2 if stores.kind == "redis" else 1)]
    turns = [replicas[i % len(replicas)].turn("s1", f"h{i}", 1, 5.0) for i in range(5)]
    for turn in turns:
        await turn.join()
    spans: list[tuple[str, float, float]] = []

    async def hold(i: int) -> None:
        async with turns[i]:
            start = time.monotonic()
            await asyncio.sleep(0.05)
            spans.append((f"h{i}", start, time.monotonic()))

    await asyncio.gather(*(hold(i) for i in reversed(range(5))))     # started in reverse: join order wins
    if stores.kind == "redis":                 # asyncio's semaphore orders by arrival instead
        assert [name for name, _, _ in spans] == [f"h{i}" for i in range(5)]
    spans.sort(key=lambda s: s[1])
    assert all(later[1] >= earlier[2] for earlier, later in zip(spans, spans[1:]))


async def test_turn_slots_allow_that_many_at_once(stores):
    store = await stores.open()
    inside, peak = 0, 0

    async def hold(i: int) -> None:
        nonlocal inside, peak
        async with store.turn("s1", f"h{i}", 2, 5.0):
            inside += 1
            peak = max(peak, inside)
            await asyncio.sleep(0.05)
            inside -= 1

    await asyncio.gather(*(hold(i) for i in range(6)))
    assert peak == 2


async def test_heartbeats_expire(stores):
    store = await stores.open()
    await store.beat("replica-a", 0.3)
    assert await store.replica_alive("replica-a") and not await store.replica_alive("replica-b")
    await asyncio.sleep(0.45)
    assert not await store.replica_alive("replica-a")


# ---------------------------------------------------------------- Redis only
@pytest.fixture
async def redis_stores(tmp_path, redis_server):
    made = Stores("redis", tmp_path, redis_server)
    yield made
    for store in list(made.opened):
        await made.close(store)


async def test_a_finished_job_is_never_overwritten(redis_stores):
    store = await redis_stores.open()
    job = await store.add_job(_job("j1", replica="a"))
    job.status, job.error, job.completed_at = "failed", "Replica a died", time.time()
    await store.put_job(job)                                        # the sweep reported it first ...
    late = _job("j1", replica="a", status="succeeded", stdout="late", completed_at=time.time())
    await store.put_job(late)                                       # ... so the late result does not replace it
    assert (await store.get_job("j1")).error == "Replica a died"
    assert await store.unfinished_jobs() == []


async def test_a_dead_holder_frees_the_sandbox_after_its_lease(redis_stores):
    crashed, alive = await redis_stores.open(), await redis_stores.open()
    first = crashed.turn("s1", "h1", 1, 0.4)
    await first.join()
    await first.__aenter__()
    first._renewer.cancel()                     # the replica dies holding the turn: nobody renews or releases it
    second = alive.turn("s1", "h2", 1, 0.4)
    await second.join()
    started = time.monotonic()
    async with second:
        waited = time.monotonic() - started
    assert 0.2 < waited < 2.0, waited


async def test_a_held_lease_is_renewed(redis_stores):
    store = await redis_stores.open()
    async with store.turn("s1", "h1", 1, 0.3):
        other = store.turn("s1", "h2", 1, 0.3)
        await other.join()
        with pytest.raises(asyncio.TimeoutError):          # h1 holds on well past its lease
            await asyncio.wait_for(other.__aenter__(), 1.0)
    async with store.turn("s1", "h3", 1, 0.3):
        pass


async def test_unreachable_redis_is_a_typed_503(tmp_path):
    need_redis()
    from orchard.env.service.stores.redis import RedisStore
    closed = RedisStore(f"redis://127.0.0.1:{RedisServer(tmp_path).port}/0")
    with pytest.raises(errors.StoreUnavailableError):
        await closed.open()

    server = RedisServer(tmp_path / "r").start()
    store = RedisStore(server.url, prefix="gone")
    try:
        await store.open()
        await store.put_sandbox(_sandbox(), create=True)
        server.kill()
        for call in (store.list_sandboxes(), store.get_sandbox("s1"), store.put_job(_job("j")), store.beat("a", 1)):
            with pytest.raises(errors.StoreUnavailableError) as err:
                await call
            assert err.value.status_code == 503 and err.value.retry_after
        await store.notify("job:j")                          # best effort: never raises

        deleted: list[str] = []
        backend = type("Backend", (), {"delete": lambda self, sid: deleted.append(sid),
                                       "list_live": lambda self: pytest.fail("reconcile ran without records")})()
        sandboxes = type("Sandboxes", (), {"store": store})()
        await Lifecycle(Settings(), backend, sandboxes, None).run_once()       # skipped, nothing deleted
        assert deleted == []

        server = RedisServer(tmp_path / "r", port=server.port).start()      # back, with its AOF
        assert (await store.get_sandbox("s1")).sandbox_id == "s1"
    finally:
        await store.close()
        server.kill()
