"""The SQLite store survives reopening; auth; argv building; lifecycle expiry rules."""

from __future__ import annotations

import time

import pytest

from orchard import errors
from orchard.env.server.auth import MISSING, authenticate
from orchard.env.service.callers import owner_of
from orchard.env.service.jobs import argv_of
from orchard.env.service.lifecycle import Lifecycle, spec_of
from orchard.env.service.records import JobRecord, SandboxRecord
from orchard.env.service.stores.sqlite import SqliteStore
from orchard.env.settings import Settings


def _sandbox(sid="s1", owner="o", **kw) -> SandboxRecord:
    now = time.time()
    return SandboxRecord(sandbox_id=sid, owner=owner, namespace="n", image="host", created_at=now,
                         expires_at=now + 60, cpu="1", memory="1Gi", **kw)


async def test_store_roundtrip_and_reopen(tmp_path):
    store = SqliteStore(tmp_path / "db.sqlite")
    await store.open()
    assert await store.put_sandbox(_sandbox(), create=True) is True
    assert await store.put_sandbox(_sandbox(), create=True) is False           # duplicate id
    job = JobRecord(job_id="j1", sandbox_id="s1", owner="o", command=["ls"], created_at=time.time(),
                    status="succeeded", stdout="x" * 300_000, completed_at=time.time(), idempotency_key="k")
    await store.put_job(job)
    await store.put_job(JobRecord(job_id="j2", sandbox_id="s1", owner="o", command="sleep 9",
                                  created_at=time.time()))
    await store.close()

    again = SqliteStore(tmp_path / "db.sqlite")
    await again.open()
    assert (await again.get_sandbox("s1")).image == "host"
    assert (await again.get_job("j1")).stdout == "x" * 300_000
    assert (await again.job_by_key("s1", "k")).job_id == "j1"
    assert [j.job_id for j in await again.unfinished_jobs()] == ["j2"]
    assert [r.sandbox_id for r in await again.list_sandboxes("o")] == ["s1"]
    assert await again.list_sandboxes("other") == []
    assert await again.prune_jobs(time.time() + 1) == 1
    await again.delete_sandbox("s1")
    assert await again.get_sandbox("s1") is None
    await again.close()


def test_auth_rules():
    s = Settings(api_keys=["k1"], admin_keys=["adm"])
    with pytest.raises(errors.AuthError) as missing:
        authenticate(s, None)
    assert missing.value.status_code == 401 and missing.value.detail == MISSING
    with pytest.raises(errors.ForbiddenError):
        authenticate(s, "k2")
    user, admin = authenticate(s, "k1"), authenticate(s, "adm")
    assert user.owner == owner_of("k1") and not user.admin and admin.admin
    assert not user.may_see(owner_of("other")) and admin.may_see(owner_of("other"))
    assert authenticate(Settings(no_auth=True), None).admin


def test_argv_of():
    assert argv_of("echo hi", False) == ["bash", "-c", "echo hi"]
    assert argv_of(["a", "b c"], True) == ["a", "b c"]
    login = argv_of("echo hi", True)
    assert login[:3] == ["bash", "--login", "-c"] and login[3].endswith("echo hi")


def test_expiry_rules():
    s = Settings(heartbeat_timeout=10, pending_buffer=5)
    life = Lifecycle(s, None, None, None)
    now = time.time()
    assert life._expired(_sandbox(status="ready"), now) == ""
    assert life._expired(_sandbox(status="ready"), now + 61) == "ttl"
    assert life._expired(_sandbox(status="ready", last_heartbeat=now - 11), now) == "heartbeat"
    pending = _sandbox(status="pending", timeout=1)
    assert life._expired(pending, now + 7) == "pending_timeout"


def test_spec_of_record():
    spec = spec_of(_sandbox(model_endpoint=(8000, "127.0.0.1:8300")))
    assert spec.cpu == 1.0 and spec.memory == 2**30 and spec.model_endpoint == (8000, "127.0.0.1", 8300)


def test_error_round_trip():
    err = errors.error_from_response(404, {"detail": "Sandbox x not found", "error": "SandboxNotFoundError"})
    assert isinstance(err, errors.SandboxNotFoundError) and err.detail == "Sandbox x not found"
    assert isinstance(errors.error_from_response(503, {"detail": "busy"}, 2.0), errors.OverloadedError)
    assert isinstance(errors.error_from_response(408, {"detail": "t"}), TimeoutError)
