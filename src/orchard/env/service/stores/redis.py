"""Redis store: the state several replicas behind one load balancer share, and how they coordinate.

Keys, all under the prefix (default ``orchard``):

  {p}:sb:{id}              hash: one field per SandboxRecord attribute, JSON-encoded (partial updates are atomic)
  {p}:sbs, {p}:owner:{o}   sets of every sandbox id, and of one owner's
  {p}:images:{o}           set of an owner's snapshot names
  {p}:job:{id}             a JobRecord as JSON; expires job_ttl (the job retention) after its last write
  {p}:jobs:open            hash job id -> replica of every job queued or running
  {p}:jobs:done            sorted set job id -> completed_at, for prune_jobs
  {p}:idem:{sid}:{key}     the job that took an idempotency key (set NX: one job per key across replicas)
  {p}:turn:{sid}           sorted set holder -> submission number: the sandbox's exec queue
  {p}:lease:{sid}          hash holder -> lease expiry (ms, Redis's own clock); {p}:seq:{sid} the counter
  {p}:replica:{id}         a replica's heartbeat, expiring with its lease
  {p}:wake                 pub/sub channel; a message names a key whose waiters should look again

Every replica holds one subscriber connection to ``{p}:wake`` and fans messages out to local
asyncio events. Pub/sub is at-most-once, so a wait also looks again every ``recheck`` seconds.

Persistence: records survive a Redis restart only as far as Redis persistence allows. Run Redis
with AOF (``appendonly yes``; ``appendfsync everysec`` may lose the last second of writes, ``always``
none); RDB snapshots alone lose everything since the last snapshot. A Redis that comes back empty
has forgotten every sandbox: the next reconcile then removes sandboxes that no record owns once
they are older than ``reconcile_min_age``. While Redis is unreachable every operation raises
``StoreUnavailableError`` (503 + Retry-After) and lifecycle passes are skipped, so nothing is deleted.

One Redis server (or one behind Sentinel): scripts build some key names from the prefix, which
Redis Cluster does not allow.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import time
from typing import Any, Optional
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from pydantic_core import to_jsonable_python
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError, TimeoutError as RedisTimeoutError

from orchard import errors
from orchard.env.service.records import JobRecord, SandboxRecord
from orchard.env.service.waits import Waiters

log = logging.getLogger("orchard.env")
_UNREACHABLE = (RedisConnectionError, RedisTimeoutError, ReadOnlyError, OSError)

_PUT_SANDBOX = """
if ARGV[2] == '1' and redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[1])
return 1
"""
_UPDATE_SANDBOX = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
redis.call('HSET', KEYS[1], unpack(ARGV))
return redis.call('HGETALL', KEYS[1])
"""
_ADD_JOB = """
if ARGV[5] == '1' then
  local known = redis.call('GET', KEYS[3])
  if known and redis.call('EXISTS', ARGV[6] .. known) == 1 then return known end
  redis.call('SET', KEYS[3], ARGV[1], 'EX', ARGV[3])
end
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[4])
return false
"""
_PUT_JOB = """
if redis.call('EXISTS', KEYS[1]) == 1 and redis.call('HEXISTS', KEYS[2], ARGV[1]) == 0 then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
if ARGV[7] == '1' then
  local known = redis.call('GET', KEYS[4])
  if not known or known == ARGV[1] then redis.call('SET', KEYS[4], ARGV[1], 'EX', ARGV[3]) end
end
if ARGV[4] == '1' then
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('ZADD', KEYS[3], ARGV[6], ARGV[1])
else
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[5])
end
return 1
"""
# Turns: KEYS = queue, leases, counter; ARGV = holder, lease_ms[, slots]. Leases use Redis's clock.
_TURN_PRELUDE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function keep()
  redis.call('HSET', KEYS[2], ARGV[1], now + tonumber(ARGV[2]))
  for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], 4 * tonumber(ARGV[2])) end
end
"""
_JOIN = _TURN_PRELUDE + """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], redis.call('INCR', KEYS[3]), ARGV[1])
end
keep()
return 1
"""
_ACQUIRE = _TURN_PRELUDE + """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return -1 end
keep()
local slots = tonumber(ARGV[3])
while true do
  local dropped = false
  for _, holder in ipairs(redis.call('ZRANGE', KEYS[1], 0, slots - 1)) do
    if holder == ARGV[1] then return 1 end
    if tonumber(redis.call('HGET', KEYS[2], holder) or '0') < now then
      redis.call('ZREM', KEYS[1], holder)
      redis.call('HDEL', KEYS[2], holder)
      dropped = true
    end
  end
  if not dropped then return 0 end
end
"""
_RENEW = _TURN_PRELUDE + """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
keep()
return 1
"""
_RELEASE = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if redis.call('ZCARD', KEYS[1]) == 0 then redis.call('DEL', KEYS[1], KEYS[2], KEYS[3]) end
return 1
"""


def _unavailable_as_503(fn):
    """Turn Redis connection failures into the typed 503 every caller knows how to handle."""
    @functools.wraps(fn)
    async def guarded(self: "RedisStore", *args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(self, *args, **kwargs)
        except _UNREACHABLE as e:
            raise errors.StoreUnavailableError(
                f"The state store (Redis at {self.safe_url}) is unreachable: {e}", retry_after=2) from e
    return guarded


class RedisStore:
    """Store on one Redis server, shared by every replica."""

    shared = True

    def __init__(self, url: str, prefix: str = "orchard", *, job_ttl: float = 7 * 86400, recheck: float = 5.0,
                 max_connections: int = 64):
        self.url, self.prefix, self.recheck = url, prefix, recheck
        self.safe_url = _without_password(url)
        self.job_ttl = max(1, math.ceil(job_ttl))
        self._max_connections = max_connections
        self._redis: Optional[aioredis.Redis] = None
        self._waiters = Waiters()
        self._listener: Optional[asyncio.Task] = None
        self._scripts: dict[str, Any] = {}

    # ------------------------------------------------------------ lifetime
    async def open(self) -> None:
        pool = aioredis.BlockingConnectionPool.from_url(
            self.url, max_connections=self._max_connections, timeout=5, socket_connect_timeout=2,
            socket_timeout=15, retry=Retry(ExponentialBackoff(cap=0.25, base=0.05), 2),
            retry_on_error=[RedisConnectionError, RedisTimeoutError])
        self._redis = aioredis.Redis(connection_pool=pool)
        self._scripts = {name: self._redis.register_script(text) for name, text in (
            ("put_sandbox", _PUT_SANDBOX), ("update_sandbox", _UPDATE_SANDBOX), ("add_job", _ADD_JOB),
            ("put_job", _PUT_JOB), ("join", _JOIN), ("acquire", _ACQUIRE), ("renew", _RENEW), ("release", _RELEASE))}
        try:
            subscriber = await self._subscribe()      # before serving: no wake-up may be missed
        except _UNREACHABLE as e:
            await self._redis.aclose(close_connection_pool=True)
            raise errors.StoreUnavailableError(f"Cannot reach Redis at {self.safe_url}: {e}") from e
        self._listener = asyncio.create_task(self._listen(subscriber))

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.gather(self._listener, return_exceptions=True)
        if self._redis is not None:
            await self._redis.aclose(close_connection_pool=True)
            self._redis = None

    @property
    def r(self) -> aioredis.Redis:
        if self._redis is None:
            raise RuntimeError("store is not open")
        return self._redis

    def _key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    # ------------------------------------------------------------ sandboxes
    @_unavailable_as_503
    async def put_sandbox(self, record: SandboxRecord, *, create: bool = False) -> bool:
        keys = [self._key("sb", record.sandbox_id), self._key("sbs"), self._key("owner", record.owner)]
        args = [record.sandbox_id, "1" if create else "0", *_fields(record.model_dump(mode="json"))]
        return await self._scripts["put_sandbox"](keys=keys, args=args) == 1

    @_unavailable_as_503
    async def update_sandbox(self, sandbox_id: str, **fields: Any) -> Optional[SandboxRecord]:
        flat = await self._scripts["update_sandbox"](
            keys=[self._key("sb", sandbox_id)], args=_fields(to_jsonable_python(fields)))
        return _record(dict(zip(flat[::2], flat[1::2]))) if flat else None

    @_unavailable_as_503
    async def get_sandbox(self, sandbox_id: str) -> Optional[SandboxRecord]:
        return _record(await self.r.hgetall(self._key("sb", sandbox_id)))

    @_unavailable_as_503
    async def list_sandboxes(self, owner: Optional[str] = None) -> list[SandboxRecord]:
        ids = sorted(m.decode() for m in await self.r.smembers(
            self._key("sbs") if owner is None else self._key("owner", owner)))
        async with self.r.pipeline(transaction=False) as pipe:
            for sid in ids:
                pipe.hgetall(self._key("sb", sid))
            rows = await pipe.execute() if ids else []
        return [r for r in map(_record, rows) if r is not None and (owner is None or r.owner == owner)]

    @_unavailable_as_503
    async def delete_sandbox(self, sandbox_id: str) -> bool:
        key = self._key("sb", sandbox_id)
        owner = await self.r.hget(key, "owner")
        if owner is None:
            return False
        async with self.r.pipeline(transaction=True) as pipe:
            pipe.delete(key).srem(self._key("sbs"), sandbox_id).srem(self._key("owner", json.loads(owner)), sandbox_id)
            removed, *_ = await pipe.execute()
        return removed == 1

    @_unavailable_as_503
    async def put_image(self, owner: str, name: str) -> None:
        await self.r.sadd(self._key("images", owner), name)

    @_unavailable_as_503
    async def list_images(self, owner: str) -> list[str]:
        return sorted(m.decode() for m in await self.r.smembers(self._key("images", owner)))

    # ------------------------------------------------------------ jobs
    @_unavailable_as_503
    async def add_job(self, job: JobRecord) -> JobRecord:
        known = await self._scripts["add_job"](
            keys=[self._key("job", job.job_id), self._key("jobs", "open"), self._idem(job)],
            args=[job.job_id, job.model_dump_json(), self.job_ttl, job.replica or "", "1" if job.idempotency_key else "0",
                  self._key("job", "")])
        if known is None:
            return job
        return await self.get_job(known.decode()) or job

    @_unavailable_as_503
    async def put_job(self, job: JobRecord) -> None:
        await self._scripts["put_job"](
            keys=[self._key("job", job.job_id), self._key("jobs", "open"), self._key("jobs", "done"), self._idem(job)],
            args=[job.job_id, job.model_dump_json(), self.job_ttl, "1" if job.finished else "0", job.replica or "",
                  job.completed_at or time.time(), "1" if job.idempotency_key else "0"])

    def _idem(self, job: JobRecord) -> str:
        """The idempotency key's Redis key (the job's own key when it has none, never touched then)."""
        if job.idempotency_key:
            return self._key("idem", job.sandbox_id, job.idempotency_key)
        return self._key("job", job.job_id)

    @_unavailable_as_503
    async def get_job(self, job_id: str) -> Optional[JobRecord]:
        raw = await self.r.get(self._key("job", job_id))
        return JobRecord.model_validate_json(raw) if raw else None

    @_unavailable_as_503
    async def job_by_key(self, sandbox_id: str, key: str) -> Optional[JobRecord]:
        job_id = await self.r.get(self._key("idem", sandbox_id, key))
        return await self.get_job(job_id.decode()) if job_id else None

    @_unavailable_as_503
    async def unfinished_jobs(self) -> list[JobRecord]:
        ids = [i.decode() for i in await self.r.hkeys(self._key("jobs", "open"))]
        raws = await self.r.mget([self._key("job", i) for i in ids]) if ids else []
        gone = [i for i, raw in zip(ids, raws) if raw is None]      # expired records leave their index entry
        if gone:
            await self.r.hdel(self._key("jobs", "open"), *gone)
        return [JobRecord.model_validate_json(raw) for raw in raws if raw is not None]

    @_unavailable_as_503
    async def prune_jobs(self, completed_before: float) -> int:
        done = self._key("jobs", "done")
        ids = [i.decode() for i in await self.r.zrangebyscore(done, "-inf", f"({completed_before}")]
        if not ids:
            return 0
        async with self.r.pipeline(transaction=True) as pipe:
            pipe.delete(*[self._key("job", i) for i in ids]).zrem(done, *ids)
            removed, _ = await pipe.execute()
        return removed

    # ------------------------------------------------------------ coordination
    def event(self, key: str) -> asyncio.Event:
        return self._waiters.event(key)

    async def notify(self, key: str) -> None:
        self._waiters.notify(key)          # at once here; the echo from Redis is a harmless second wake-up
        try:
            await self.r.publish(self._key("wake"), key)
        except _UNREACHABLE as e:
            log.warning("cannot publish wake-up %s (waiters elsewhere look again within %gs): %s", key, self.recheck, e)

    def turn(self, sandbox_id: str, holder: str, slots: int, lease: float) -> "RedisTurn":
        return RedisTurn(self, sandbox_id, holder, slots, lease)

    @_unavailable_as_503
    async def beat(self, replica_id: str, lease: float) -> None:
        await self.r.set(self._key("replica", replica_id), repr(time.time()), px=max(1, int(lease * 1000)))

    @_unavailable_as_503
    async def replica_alive(self, replica_id: str) -> bool:
        return await self.r.exists(self._key("replica", replica_id)) == 1

    @_unavailable_as_503
    async def turn_script(self, name: str, sandbox_id: str, *args: Any) -> int:
        keys = [self._key("turn", sandbox_id), self._key("lease", sandbox_id), self._key("seq", sandbox_id)]
        return await self._scripts[name](keys=keys, args=list(args))

    async def _subscribe(self) -> aioredis.client.PubSub:
        subscriber = self.r.pubsub(ignore_subscribe_messages=True)
        try:
            await subscriber.subscribe(self._key("wake"))
        except BaseException:
            await _close_quietly(subscriber)
            raise
        return subscriber

    async def _listen(self, subscriber: aioredis.client.PubSub) -> None:
        """Fan wake-ups out to local events; after a lost connection, wake everyone to look again."""
        while True:
            try:
                while True:
                    message = await subscriber.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is not None and message["type"] == "message":
                        self._waiters.notify(message["data"].decode())
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("Redis wake-up channel lost (%s); resubscribing", e)
            finally:
                await _close_quietly(subscriber)
            subscriber = await self._resubscribe()
            self._waiters.notify_all()

    async def _resubscribe(self) -> aioredis.client.PubSub:
        while True:
            try:
                return await self._subscribe()
            except Exception:
                await asyncio.sleep(0.5)


class RedisTurn:
    """A job's place in a sandbox's exec queue in Redis, held under a lease that is renewed while it runs."""

    def __init__(self, store: RedisStore, sandbox_id: str, holder: str, slots: int, lease: float):
        self.store, self.sandbox_id, self.holder, self.slots = store, sandbox_id, holder, slots
        self.lease, self._lease_ms = lease, max(1, int(lease * 1000))
        self._wake = f"turn:{sandbox_id}"
        self._renewer: Optional[asyncio.Task] = None

    async def join(self) -> None:
        await self.store.turn_script("join", self.sandbox_id, self.holder, self._lease_ms)

    async def leave(self) -> None:
        try:
            await self.store.turn_script("release", self.sandbox_id, self.holder)
        except errors.StoreUnavailableError:
            pass                                   # the place expires with its lease
        await self.store.notify(self._wake)

    async def __aenter__(self) -> "RedisTurn":
        period = self.lease / 3
        while True:
            ev = self.store.event(self._wake)
            try:
                got = await self.store.turn_script("acquire", self.sandbox_id, self.holder, self._lease_ms, self.slots)
                if got == 1:
                    break
                if got == -1:                      # never joined, or the place expired: queue again at the back
                    await self.join()
                    continue
            except errors.StoreUnavailableError:
                await asyncio.sleep(min(period, 1.0))    # wait for Redis; the job stays queued
                continue
            await Waiters.wait(ev, period)         # released, or time to renew the place and look for expired holders
        self._renewer = asyncio.create_task(self._renew(period))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            await asyncio.gather(self._renewer, return_exceptions=True)
        await self.leave()

    async def _renew(self, period: float) -> None:
        warned = False
        while True:
            await asyncio.sleep(period)
            try:
                kept = await self.store.turn_script("renew", self.sandbox_id, self.holder, self._lease_ms)
            except errors.StoreUnavailableError as e:
                log.warning("cannot renew the exec lease of %s on %s: %s", self.holder, self.sandbox_id, e.detail)
                continue
            if not kept and not warned:
                warned = True
                log.warning("job %s lost its exec lease on sandbox %s (stalled longer than %gs?)",
                            self.holder, self.sandbox_id, self.lease)


async def _close_quietly(subscriber: aioredis.client.PubSub) -> None:
    try:
        await subscriber.aclose()
    except Exception:
        pass


def _fields(values: dict[str, Any]) -> list[str]:
    return [part for name, value in values.items() for part in (name, json.dumps(value))]


def _record(row: dict) -> Optional[SandboxRecord]:
    if not row:
        return None
    return SandboxRecord.model_validate({k.decode(): json.loads(v) for k, v in row.items()})


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
