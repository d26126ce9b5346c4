"""ContainerBackend in-process against a real Podman API service: both exec paths, labels and limits, files,
adoption, deaths noticed, snapshots, network isolation, images without `sleep`, and the exec benchmark.

The whole contract suite runs against this backend too (tests/env/contract_container); these tests look
at what only the backend's side shows (engine objects, cgroups, nftables, timings).
"""

from __future__ import annotations

import asyncio
import io
import os
import socket
import subprocess
import tarfile
import threading
import time
import uuid
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from orchard import errors
from orchard.env.backends.base import ExecSpec, SandboxSpec
from orchard.env.backends.container_images import SNAPSHOT_REPOSITORY, snapshot_reference
from orchard.env.settings import Settings
from tests.env.podman_api import Engine, podman_engine

docker = pytest.importorskip("docker", reason="the container backend needs the docker package")

from orchard.env.backends.container import ContainerBackend, _split_reference  # noqa: E402


@pytest.fixture(scope="module")
def engine() -> Engine:
    yield from podman_engine()


@pytest.fixture(scope="module")
def api(engine):
    with docker.APIClient(base_url=engine.url, timeout=120) as client:
        yield client


def settings_for(engine: Engine, state_dir: Path, mode: str = "auto") -> Settings:
    return Settings(backend="container", docker_host=engine.url, state_dir=state_dir, namespace=engine.namespace,
                    container_exec=mode)


class Exits:
    """Collects on_exit reports."""

    def __init__(self):
        self.seen: dict[str, str] = {}
        self.event = asyncio.Event()

    async def __call__(self, sandbox_id: str, message: str) -> None:
        self.seen[sandbox_id] = message
        self.event.set()


@asynccontextmanager
async def running(engine: Engine, state_dir: Path, mode: str = "auto", exits: Exits | None = None):
    """A started backend. mode: auto (fast path), api (engine API), remote (as if the engine ran elsewhere)."""
    backend = ContainerBackend(settings_for(engine, state_dir, "auto" if mode == "auto" else "api"))
    await backend.start(exits or Exits())
    if mode == "remote":
        backend.here, backend.helper, backend.fast_exec = False, "", False
    try:
        yield backend
    finally:
        for sid in list(backend._boxes):
            await backend.delete(sid)
        await backend.close()


def spec(image: str = "host", **kw) -> SandboxSpec:
    kw.setdefault("sandbox_id", f"t-{uuid.uuid4().hex[:10]}")
    return SandboxSpec(image=image, cpu=0.5, memory=256 * 2**20, pids=128, created_at=time.time(), **kw)


def run(argv, timeout: float = 30, **kw) -> ExecSpec:
    return ExecSpec(argv=argv, timeout=timeout, **kw)


# ---------------------------------------------------------------- no engine needed
def test_snapshot_references_are_valid_and_distinct():
    a, b = snapshot_reference("@alice/My Snap:v1", "svc1"), snapshot_reference("@bob/My Snap:v1", "svc1")
    assert a != b and a.startswith(SNAPSHOT_REPOSITORY + "/") and a.endswith(":latest")
    assert snapshot_reference("@alice/My Snap:v1", "svc2") != a          # another service's snapshot of that name
    repo = a.rsplit(":", 1)[0]
    assert repo == repo.lower() and " " not in repo and "@" not in repo


def test_split_reference():
    assert _split_reference("busybox") == ("busybox", "latest")
    assert _split_reference("busybox:1.36") == ("busybox", "1.36")
    assert _split_reference("localhost:5000/app") == ("localhost:5000/app", "latest")
    assert _split_reference("localhost:5000/app:2") == ("localhost:5000/app", "2")
    assert _split_reference("app@sha256:abc") == ("app", "sha256:abc")


# ---------------------------------------------------------------- lifecycle
@pytest.mark.parametrize("mode", ["auto", "api"])
async def test_container_carries_labels_and_limits(engine, api, tmp_path, mode):
    async with running(engine, tmp_path, mode) as backend:
        s = spec()
        await backend.create(s)
        assert backend._boxes[s.sandbox_id].fast == (mode == "auto")
        info = api.inspect_container(backend._container_name(s.sandbox_id))
        labels, host = info["Config"]["Labels"], info["HostConfig"]
        assert labels["orchard.sandbox"] == s.sandbox_id and labels["orchard.service"] == backend.tag
        assert host["NanoCpus"] == 500_000_000 and host["Memory"] == 256 * 2**20 == host["MemorySwap"]
        assert host["PidsLimit"] == 128 and host["NetworkMode"] == "none"
        r = await backend.exec(s.sandbox_id, run(["grep", "CapEff", "/proc/1/status", "/proc/self/status"]))
        assert r.stdout.count(b"\t0000000000000000") == 2, r     # the container's init and commands: no capabilities
        assert {l.sandbox_id for l in await backend.list_live()} >= {s.sandbox_id}
        await backend.delete(s.sandbox_id)
        await backend.delete(s.sandbox_id)                 # idempotent
        assert s.sandbox_id not in {l.sandbox_id for l in await backend.list_live()}
        with pytest.raises(docker.errors.NotFound):
            api.inspect_container(backend._container_name(s.sandbox_id))


async def test_unknown_image_says_why_and_lists_images(engine, tmp_path):
    async with running(engine, tmp_path) as backend:
        with pytest.raises(errors.SandboxFailedError) as err:
            await backend.create(spec("no-such-image-xyz:1"))
        assert "Available: host" in err.value.detail and "pull failed" in err.value.detail
        with pytest.raises(errors.SandboxFailedError):
            await backend.create(spec("/not/a/reference"))
        assert backend._boxes == {}


async def test_list_live_is_none_when_the_engine_is_unreachable(engine, tmp_path):
    async with running(engine, tmp_path) as backend:
        backend.client = docker.DockerClient(base_url=f"unix://{tmp_path}/nothing.sock", version="1.41")
        assert await backend.list_live() is None             # never "no sandboxes": reconcile must skip


# ---------------------------------------------------------------- exec
@pytest.mark.parametrize("mode", ["auto", "api", "remote"])
async def test_exec_output_codes_cwd_and_timeout(engine, tmp_path, mode):
    async with running(engine, tmp_path, mode) as backend:
        s = spec()
        await backend.create(s)
        r = await backend.exec(s.sandbox_id, run(["bash", "-c", "echo $0 $FOO; pwd; echo e >&2; exit 3"],
                                                 env={"FOO": "bar"}))
        assert (r.exit_code, r.stdout, r.stderr, r.error) == (3, b"bash bar\n/workspace\n", b"e\n", None)
        r = await backend.exec(s.sandbox_id, run(["pwd"], cwd="/no/such/dir"))
        assert "/no/such/dir" in (r.error or "")
        r = await backend.exec(s.sandbox_id, run(["no-such-program"]))
        assert r.exit_code == 127
        t = time.monotonic()
        r = await backend.exec(s.sandbox_id, run(["bash", "-c", "echo go; (sleep 300 &); sleep 300"], timeout=1))
        assert (r.exit_code, r.stdout) == (124, b"go\n") and time.monotonic() - t < 10
        ps = await backend.exec(s.sandbox_id, run(["ps", "-eo", "args"]))
        assert b"sleep 300" not in ps.stdout
        if mode == "auto":                                   # the job groups are gone with the jobs
            await asyncio.sleep(0.2)
            kill_dir = backend._boxes[s.sandbox_id].cgroups.kill_dir
            assert not [d for d in os.listdir(kill_dir) if d.startswith("orchard-job-")]


@pytest.mark.parametrize("mode", ["auto", "api"])
async def test_files_and_listing(engine, tmp_path, mode):
    async with running(engine, tmp_path, mode) as backend:
        s = spec()
        await backend.create(s)
        sid = s.sandbox_id
        await backend.write_file(sid, "/data/deep/f.bin", b"\x00bin\xff", 0o640)
        assert await backend.read_file(sid, "/data/deep/f.bin", 1024) == b"\x00bin\xff"
        r = await backend.exec(sid, run(["stat", "-c", "%a", "/data/deep/f.bin"]))
        assert r.stdout == b"640\n"
        await backend.exec(sid, run(["bash", "-c", "ln -s /nowhere /data/broken; mkdir /data/sub"]))
        entries = await backend.list_dir(sid, "/data")
        assert [(e.name, e.type) for e in entries] == [("broken", "symlink"), ("deep", "directory"),
                                                       ("sub", "directory")]
        with pytest.raises(errors.NotFoundError):
            await backend.read_file(sid, "/missing", 10)
        with pytest.raises(errors.RequestError):
            await backend.read_file(sid, "/data", 10)
        with pytest.raises(errors.PayloadTooLargeError):
            await backend.read_file(sid, "/data/deep/f.bin", 2)
        with pytest.raises(errors.NotFoundError):
            await backend.list_dir(sid, "/missing")


async def test_pty_on_both_paths(engine, tmp_path):
    for mode in ("auto", "api"):
        async with running(engine, tmp_path / mode, mode) as backend:
            s = spec()
            await backend.create(s)
            proc = await backend.open_pty(s.sandbox_id, ["bash", "--norc", "-i"], None, {}, 24, 80)
            os.set_blocking(proc.master_fd, False)
            os.write(proc.master_fd, b"stty -echo; echo $((6*7)); exit 4\n")
            out = b""
            deadline = time.monotonic() + 20
            while b"42" not in out and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                try:
                    out += os.read(proc.master_fd, 4096)
                except BlockingIOError:
                    pass
            assert b"42" in out, (mode, out)
            assert await asyncio.wait_for(proc.wait(), 20) == 4
            await proc.kill()


# ---------------------------------------------------------------- restart, deaths
async def test_adopt_after_a_service_restart(engine, tmp_path):
    s = spec()
    async with running(engine, tmp_path) as first:
        await first.create(s)
        await first.exec(s.sandbox_id, run(["bash", "-c", "echo kept > /workspace/f"]))
        first._boxes.clear()                                # a restart forgets; the container stays
        first._pids.close()
    async with running(engine, tmp_path) as second:
        assert await second.adopt(s)
        r = await second.exec(s.sandbox_id, run(["cat", "/workspace/f"]))
        assert r.stdout == b"kept\n"
        assert not await second.adopt(spec())               # nothing of that id: gone


@pytest.mark.parametrize("mode", ["auto", "remote"])
async def test_a_container_killed_from_outside_is_reported(engine, api, tmp_path, mode):
    exits = Exits()
    async with running(engine, tmp_path, mode, exits) as backend:
        s = spec()
        await backend.create(s)
        api.kill(backend._container_name(s.sandbox_id))
        await asyncio.wait_for(exits.event.wait(), 15)
        assert s.sandbox_id in exits.seen
        with pytest.raises(errors.SandboxNotFoundError):
            await backend.exec(s.sandbox_id, run(["true"]))
        await backend.delete(s.sandbox_id)


# ---------------------------------------------------------------- images, snapshots
async def test_snapshot_then_start_from_it(engine, api, tmp_path):
    name = f"@owner-{uuid.uuid4().hex[:6]}/snap:v1"
    async with running(engine, tmp_path) as backend:
        s = spec()
        await backend.create(s)
        await backend.exec(s.sandbox_id, run(["bash", "-c", "echo prepared > /workspace/state"]))
        assert await backend.snapshot(s.sandbox_id, name) >= 0
        child = spec(name)
        try:
            await backend.create(child)
            r = await backend.exec(child.sandbox_id, run(["cat", "/workspace/state"]))
            assert r.stdout == b"prepared\n"
            assert snapshot_reference(name, backend.tag) not in backend.images()   # snapshots stay their owners'
        finally:
            await backend.delete(child.sandbox_id)
            api.remove_image(snapshot_reference(name, backend.tag), force=True)


async def test_an_image_without_sleep_or_shell_starts(engine, api, tmp_path):
    """The helper is the container's init, so an image holding one static program works."""
    busybox = "/usr/bin/busybox" if os.path.exists("/usr/bin/busybox") else "/bin/busybox"
    if not os.path.exists(busybox):
        pytest.skip("busybox-static is not installed")
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        tar.add(busybox, arcname="busybox")        # no applet links: no sleep, no sh
    ref = f"localhost/orchard-test-nosleep:{uuid.uuid4().hex[:8]}"
    api.import_image_from_data(archive.getvalue(), repository=ref)
    try:
        async with running(engine, tmp_path) as backend:
            s = spec(ref)
            await backend.create(s)
            r = await backend.exec(s.sandbox_id, run(["/busybox", "echo", "ok"]))
            assert r.stdout == b"ok\n"
    finally:
        api.remove_image(ref, force=True)


async def test_tools_dir_is_a_read_only_bind(engine, tmp_path):
    """settings.tools_dir appears read-only at /opt/orchard/tools, as in the local backend."""
    tools = tmp_path / "tools"
    (tools / "bin").mkdir(parents=True)
    (tools / "bin" / "greet").write_text("#!/bin/sh\necho hi\n")
    (tools / "bin" / "greet").chmod(0o755)
    settings = settings_for(engine, tmp_path / "state").model_copy(update={"tools_dir": tools})
    backend = ContainerBackend(settings)
    await backend.start(Exits())
    try:
        s = spec()
        await backend.create(s)
        assert (await backend.exec(s.sandbox_id, run(["/opt/orchard/tools/bin/greet"]))).stdout == b"hi\n"
        r = await backend.exec(s.sandbox_id, run(["sh", "-c", "touch /opt/orchard/tools/new"]))
        assert r.exit_code != 0 and b"Read-only" in r.stderr and not (tools / "new").exists()
    finally:
        for sid in list(backend._boxes):
            await backend.delete(sid)
        await backend.close()


# ---------------------------------------------------------------- network
def _listen_everywhere() -> tuple[socket.socket, int]:
    server = socket.socket()
    server.bind(("0.0.0.0", 0))
    server.listen(8)
    threading.Thread(target=lambda: [server.accept()[0].close() for _ in iter(int, 1)], daemon=True).start()
    return server, server.getsockname()[1]


async def test_networked_container_cannot_reach_the_host(engine, tmp_path):
    server, port = _listen_everywhere()
    try:
        async with running(engine, tmp_path) as backend:
            if not backend.here or not backend.net.available:
                pytest.skip(f"the engine is not on this host or nftables is unusable: {backend.net.why}")
            s = spec(block_network=False)
            await backend.create(s)
            tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
            assert f"inet {backend.net.table}" in tables
            code = (f"import socket\nfor host in ('{backend.net.gateway}', '127.0.0.1'):\n"
                    f"    try:\n        socket.create_connection((host, {port}), 2); print('reached', host)\n"
                    f"    except OSError as e: print('refused', host)\n")
            r = await backend.exec(s.sandbox_id, run(["python3", "-c", code]))
            assert b"reached" not in r.stdout and r.stdout.count(b"refused") == 2, r
            r = await backend.exec(s.sandbox_id, run(["cat", "/proc/net/dev"]))
            assert b"eth0" in r.stdout
        tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
        assert f"inet {backend.net.table}" not in tables               # dropped with the last networked container
    finally:
        server.close()


# ---------------------------------------------------------------- benchmark
def test_exec_benchmark_prints_both_paths(engine, tmp_path):
    from orchard.env.bench_container import backend_latency, podman_exec_latency

    fast = asyncio.run(backend_latency(engine.url, "auto", 30, tmp_path, engine.namespace))
    slow = asyncio.run(backend_latency(engine.url, "api", 30, tmp_path, engine.namespace))
    baseline = podman_exec_latency(engine.host_image, 10)
    print(f"\ncontainer exec `true` p50/p99: fast path {fast['exec_true_ms']['p50']}/{fast['exec_true_ms']['p99']} ms, "
          f"engine API {slow['exec_true_ms']['p50']}/{slow['exec_true_ms']['p99']} ms, "
          f"podman exec {baseline.get('exec_true_ms', {}).get('p50')} ms")
    assert fast["path"] == "fast (helper)" and slow["path"] == "engine API"
    assert fast["exec_true_ms"]["p50"] < slow["exec_true_ms"]["p50"]


# ---------------------------------------------------------------- replicas
def test_replicas_sharing_a_store_share_containers(engine, tmp_path):
    from orchard.env.backends.container import service_tag

    def tag(state: str, **kw) -> str:
        return service_tag(Settings(backend="container", state_dir=tmp_path / state, **kw))

    shared = {"store": "redis", "redis_url": "redis://10.0.0.1:6379/0"}
    assert tag("a", **shared) == tag("b", **shared)                 # one service, whatever each state dir
    assert tag("a") != tag("b") and tag("a", **shared) != tag("a", redis_url="redis://10.0.0.2:6379/0", store="redis")


@pytest.mark.parametrize("mode", ["auto", "remote"])
async def test_a_replica_attaches_to_a_container_another_started(engine, tmp_path, mode, monkeypatch):
    monkeypatch.setenv("ORCHARD_STORE", "redis")
    monkeypatch.setenv("ORCHARD_REDIS_URL", f"redis://127.0.0.1:1/{uuid.uuid4().hex[:6]}")  # never contacted here
    exits = Exits()
    async with running(engine, tmp_path / "a", mode) as first, running(engine, tmp_path / "b", mode, exits) as second:
        s = spec()
        await first.create(s)
        await first.exec(s.sandbox_id, run(["bash", "-c", "echo from-a > /workspace/f"]))
        lookups = []
        inspect = second._inspect_box
        monkeypatch.setattr(second, "_inspect_box", lambda *a: lookups.append(a) or inspect(*a))
        results = await asyncio.gather(*(second.exec(s.sandbox_id, run(["cat", "/workspace/f"])) for _ in range(4)))
        assert [r.stdout for r in results] == [b"from-a\n"] * 4 and len(lookups) == 1   # one shared first lookup
        assert await second.read_file(s.sandbox_id, "/workspace/f", 100) == b"from-a\n"

        await first.delete(s.sandbox_id)                     # gone under the second replica's handle
        await asyncio.wait_for(exits.event.wait(), 15)
        assert s.sandbox_id not in second._boxes
        with pytest.raises(errors.SandboxNotFoundError):
            await second.exec(s.sandbox_id, run(["true"]))
        with pytest.raises(errors.SandboxNotFoundError):
            await second.exec(f"t-{uuid.uuid4().hex[:10]}", run(["true"]))      # never existed


async def test_an_engine_pty_waited_on_at_once_reports_its_own_exit_code(engine, tmp_path):
    """The engine may report an exec that has not begun as not running with code 0: wait must not take that."""
    async with running(engine, tmp_path, "api") as backend:
        s = spec()
        await backend.create(s)
        for _ in range(8):
            proc = await backend.open_pty(s.sandbox_id, ["sh", "-c", "exit 4"], None, {}, 24, 80)
            assert await asyncio.wait_for(proc.wait(), 20) == 4
            await proc.kill()
