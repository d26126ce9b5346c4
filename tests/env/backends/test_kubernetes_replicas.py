"""Two Kubernetes backends on one fake cluster, as two service replicas are: each serves the other's sandboxes.

In-process, so the test sees every API call: a replica reads another replica's sandbox's token Secret
once, however many first uses arrive at once, and forgets the handle when its watch reports the pod gone.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from orchard import errors
from orchard.env.backends import kubernetes
from orchard.env.backends import kubernetes_pods as pods
from orchard.env.backends.base import ExecSpec
from orchard.env.runner import free_port
from tests.env.backends.test_kubernetes import Cluster, gone, spec, started
from tests.env.kube_fake import skip_without_bwrap


@pytest.fixture
def cluster(tmp_path):
    skip_without_bwrap()
    made = Cluster(tmp_path)
    yield made
    made.stop()


@pytest.fixture
async def replicas(tmp_path, cluster, monkeypatch):
    monkeypatch.setattr(kubernetes, "ATTACH_WAIT", 0.5)     # an unknown sandbox is not waited for long here
    a, a_exits = await started(tmp_path / "a", cluster)
    b, b_exits = await started(tmp_path / "b", cluster)
    a.exits, b.exits = a_exits, b_exits
    yield a, b
    await asyncio.gather(a.close(), b.close())


def secret_reads(cluster, since: int) -> list[str]:
    return [name for verb, kind, name in cluster.store.calls[since:] if verb == "get" and kind == "secrets"]


def leftovers(cluster, sid: str) -> set[str]:
    return {name for kind in ("secrets", "networkpolicies") for name in cluster.names(kind) if sid in name}


async def until(check, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} not seen within {timeout}s"
        await asyncio.sleep(0.05)


async def test_the_other_replica_attaches_once_and_serves_everything(replicas, cluster):
    a, b = replicas
    await a.create(spec("shared", model_endpoint=(8000, "127.0.0.1", free_port())))
    before = len(cluster.store.calls)
    outs = await asyncio.gather(*(b.exec("shared", ExecSpec(["echo", str(i)])) for i in range(5)))
    assert [o.stdout for o in outs] == [f"{i}\n".encode() for i in range(5)]
    assert secret_reads(cluster, before) == [pods.secret_name("shared")], "one shared lookup"

    await b.write_file("shared", "/workspace/from-b", b"written on b", None)
    assert await a.read_file("shared", "/workspace/from-b", 100) == b"written on b"
    assert "from-b" in [e.name for e in await b.list_dir("shared", "/workspace")]
    assert await b.workdir("shared") == "/workspace"
    pty = await b.open_pty("shared", ["sh", "-c", "exit 3"], None, {}, 24, 80)
    assert await pty.wait() == 3
    await pty.kill()
    assert (await a.exec("shared", ExecSpec(["true"]))).exit_code == 0
    assert secret_reads(cluster, before) == [pods.secret_name("shared")], "the creator never reads it, b only once"

    assert pods.model_name("shared") in leftovers(cluster, "shared")
    await b.delete("shared")                                  # b never learnt which policies it has: all go
    await gone(cluster, "shared")
    assert leftovers(cluster, "shared") == set()
    await until(lambda: a.exits, "a reporting its sandbox's pod gone")
    assert a.exits == [("shared", "The sandbox's pod was deleted")] and b.exits == []
    with pytest.raises(errors.SandboxNotFoundError):
        await a.exec("shared", ExecSpec(["true"]))


async def test_a_networked_sandbox_deleted_by_the_other_replica_leaves_nothing(replicas, cluster):
    a, b = replicas
    await b.create(spec("net", block_network=False))
    assert (await a.exec("net", ExecSpec(["hostname"]))).stdout == b"net\n"
    assert pods.egress_name("net") in leftovers(cluster, "net")
    await a.delete("net")
    await gone(cluster, "net")
    assert leftovers(cluster, "net") == set()
    await until(lambda: "net" not in a._boxes and b.exits, "both replicas forgetting the pod")
    assert a.exits == []


async def test_a_sandbox_that_is_not_there_is_not_found_at_once(replicas, cluster, monkeypatch):
    a, b = replicas
    monkeypatch.setattr(kubernetes, "ATTACH_WAIT", 60.0)     # no Secret: nothing to wait for
    started_at = time.monotonic()
    with pytest.raises(errors.SandboxNotFoundError):
        await b.exec("never-was", ExecSpec(["true"]))
    await a.create(spec("lost"))
    await until(lambda: "lost" in b.informer.states, "b watching the pod")
    await a.delete("lost")
    await until(lambda: "lost" not in b.informer.states, "b seeing the pod deleted")
    with pytest.raises(errors.SandboxNotFoundError):
        await b.read_file("lost", "/etc/hostname", 100)
    assert "lost" not in b._boxes
    assert time.monotonic() - started_at < 30


async def test_a_replica_whose_watch_lags_waits_for_the_pod(replicas, cluster, monkeypatch):
    a, b = replicas
    monkeypatch.setattr(kubernetes, "ATTACH_WAIT", 60.0)
    loop, early = asyncio.get_running_loop(), []

    def first_use_before_the_pod_runs(pod: dict) -> None:     # the API server's thread, before the kubelet's hook
        early.append(asyncio.run_coroutine_threadsafe(b.exec("late", ExecSpec(["echo", "served"])), loop))
        deadline = time.monotonic() + 30
        while "late" not in b.informer._changed and time.monotonic() < deadline:     # b waits on its watch
            time.sleep(0.01)

    cluster.store.on_create.insert(0, first_use_before_the_pod_runs)
    await a.create(spec("late"))
    assert (await asyncio.wait_for(asyncio.wrap_future(early[0]), 60)).stdout == b"served\n"
    await a.delete("late")


async def test_the_first_use_on_the_other_replica_knows_the_image_workdir(replicas, cluster):
    a, b = replicas

    def image_workdir(pod: dict) -> None:                     # as an image with WORKDIR /tmp would run
        pod["spec"]["containers"][0]["workingDir"] = "/tmp"

    cluster.store.on_create.insert(0, image_workdir)
    await a.create(spec("wd"))
    assert await b.workdir("wd") == "/tmp"                    # a relative path's base, before any other call
    assert (await b.exec("wd", ExecSpec(["pwd"]))).stdout == b"/tmp\n"
    await a.delete("wd")
