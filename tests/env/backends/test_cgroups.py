"""Cgroups: real v1 (and the real cgroup2 mount of a hybrid host) for kills and limits; a fake v2 tree for layout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchard.env.backends.cgroups import Cgroups
from orchard.errors import BackendError

JOIN = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo 0 > "$1" || exit 99; shift; n=$((n-1)); done; exec "$@"'


def start_in(procs: list[str], *argv: str, **kw) -> subprocess.Popen:
    """Start argv after it has joined the given cgroups."""
    return subprocess.Popen(["sh", "-c", JOIN, "sh", str(len(procs)), *procs, *argv], **kw)


def wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def read(path: str | Path) -> str:
    return Path(path).read_text().strip()


def words(path: str | Path) -> set[str]:
    return set(read(path).split())


def _unified_mount() -> str | None:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        if tail.split()[0] == "cgroup2":
            return fields.split()[4]
    return None


def _real(root: str) -> Cgroups:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    cg = Cgroups(root=root, parent_name=f"orchard-test-{os.getpid()}")
    if not cg.available:
        pytest.skip(f"cgroups not usable here: {cg.why}")
    return cg


def _cleanup(cg: Cgroups) -> None:
    for sid in cg.list():
        cg.remove(sid)
    for base in cg._bases():
        if os.path.isdir(base):
            os.rmdir(base)


@pytest.fixture(params=["default", "unified"])
def cg(request):
    """The host's own cgroups, and the cgroup2 mount too on a hybrid (v1 + unified) host."""
    if request.param == "default":
        root = "/sys/fs/cgroup"
    else:
        root = _unified_mount() or ""
        if not root or root == "/sys/fs/cgroup":
            pytest.skip("no separate cgroup2 mount")
    cgroups = _real(root)
    yield cgroups
    _cleanup(cgroups)


@pytest.fixture()
def limited():
    """The host's default cgroups, which must carry the memory, pids and cpu controllers."""
    cgroups = _real("/sys/fs/cgroup")
    if not {"memory", "pids", "cpu"} <= cgroups.controllers:
        pytest.skip(f"controllers missing: {cgroups.controllers}")
    yield cgroups
    _cleanup(cgroups)


# ---------------------------------------------------------------- real cgroups
def test_layout_and_list(cg):
    procs = cg.create("sb-a")
    assert len(procs) == (1 if cg.version == 2 else len(set(cg._bases())))
    assert all(p.endswith("/sb-a/cgroup.procs") and os.path.exists(p) for p in procs)
    job = cg.job("sb-a", "j1")
    assert job[-1].endswith("/sb-a/j1/cgroup.procs") and os.path.exists(job[-1])
    assert job[:-1] == procs[:-1]                      # v1: the sandbox's limit groups; v2: nothing else
    assert cg.list() == ["sb-a"]
    cg.remove_job("sb-a", "j1")
    cg.remove_job("sb-a", "j1")                        # already gone: fine
    cg.remove("sb-a")
    cg.remove("sb-a")                                  # idempotent
    assert cg.list() == [] and not any(os.path.exists(p) for p in procs)


def test_kill_job_kills_its_whole_tree_and_nothing_else(cg):
    init = start_in(cg.create("sb-b"), "sleep", "300")
    other = start_in(cg.job("sb-b", "keep"), "sleep", "300")
    tree = start_in(cg.job("sb-b", "doomed"), "sh", "-c", "sleep 300 & sleep 300 & (sleep 300 &) ; wait")
    wait_for(lambda: len(cg.pids("sb-b")) >= 6)
    cg.kill_job("sb-b", "doomed")
    assert tree.wait(5) == -signal.SIGKILL
    wait_for(lambda: len(cg.pids("sb-b")) == 2)
    assert set(cg.pids("sb-b")) == {init.pid, other.pid}
    cg.remove_job("sb-b", "doomed")
    cg.remove("sb-b")
    assert init.wait(5) == -signal.SIGKILL and other.wait(5) == -signal.SIGKILL
    assert cg.list() == []


def test_remove_job_with_a_live_background_process_is_quiet(cg):
    cg.create("sb-c")
    proc = start_in(cg.job("sb-c", "bg"), "sleep", "300")
    wait_for(lambda: cg.pids("sb-c") == [proc.pid])
    cg.remove_job("sb-c", "bg")                        # EBUSY: left for remove()
    cg.remove("sb-c")
    assert proc.wait(5) == -signal.SIGKILL


def test_kill_a_fork_loop(cg):
    procs = cg.job(cg.create("sb-d") and "sb-d", "loop")
    loop = start_in(procs, "sh", "-c", "while true; do sleep 300 & done")
    wait_for(lambda: len(cg.pids("sb-d")) > 20)
    cg.kill("sb-d")
    assert loop.wait(5) == -signal.SIGKILL
    assert cg.pids("sb-d") == []
    cg.remove("sb-d")


def test_freeze_and_thaw(cg, tmp_path):
    out = tmp_path / "ticks"
    proc = start_in(cg.create("sb-e"), "sh", "-c", f"while true; do echo x >> {out}; sleep 0.01; done")
    wait_for(lambda: out.exists() and out.stat().st_size > 0)
    cg.freeze("sb-e")
    size = out.stat().st_size
    time.sleep(0.2)
    assert out.stat().st_size == size
    cg.thaw("sb-e")
    wait_for(lambda: out.stat().st_size > size)
    cg.remove("sb-e")
    assert proc.wait(5) == -signal.SIGKILL


def test_job_cgroup_cost(cg):
    cg.create("sb-f")
    n = 300
    start = time.perf_counter()
    for i in range(n):
        cg.job("sb-f", f"j{i}")
        cg.remove_job("sb-f", f"j{i}")
    per_call = (time.perf_counter() - start) / n
    print(f"\ncgroup v{cg.version} at {cg.root}: job()+remove_job() = {per_call * 1e6:.0f} us")
    assert per_call < 0.01
    cg.remove("sb-f")


def test_bad_names_are_refused(cg):
    for bad in ("../x", "a/b", "", ".hidden", "memory.max"):
        with pytest.raises(BackendError):
            cg.create(bad)


# ---------------------------------------------------------------- real limits (needs memory, pids, cpu)
def test_limits_are_written(limited):
    limited.create("sb-l", cpu=0.5, memory=64 << 20, pids=32)
    mem = limited._limit_bases["memory"] + "/sb-l"
    cpu = limited._limit_bases["cpu"] + "/sb-l"
    pids = limited._limit_bases["pids"] + "/sb-l"
    if limited.version == 1:
        assert read(f"{mem}/memory.limit_in_bytes") == str(64 << 20)
        assert (read(f"{cpu}/cpu.cfs_quota_us"), read(f"{cpu}/cpu.cfs_period_us")) == ("50000", "100000")
    else:
        assert read(f"{mem}/memory.max") == str(64 << 20)
        assert read(f"{cpu}/cpu.max") == "50000 100000"
    assert read(f"{pids}/pids.max") == "32"
    limited.remove("sb-l")


def test_memory_limit_kills_a_job_over_it(limited):
    limited.create("sb-m", memory=64 << 20)
    hog = start_in(limited.job("sb-m", "hog"), sys.executable, "-c",
                   "import time; b = bytearray(256 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(5)")
    assert hog.wait(30) == -signal.SIGKILL
    quiet = start_in(limited.job("sb-m", "ok"), sys.executable, "-c",
                     "import time; b = bytearray(16 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(30)")
    wait_for(lambda: (limited.memory_used("sb-m") or 0) > 8 << 20, timeout=10)
    limited.remove("sb-m")
    assert quiet.wait(5) == -signal.SIGKILL


def test_pids_limit_stops_forks(limited):
    limited.create("sb-p", pids=6)
    proc = start_in(limited.job("sb-p", "forks"), "sh", "-c",
                    "for i in 1 2 3 4 5 6 7 8 9 10; do sleep 300 </dev/null >/dev/null 2>&1 & done; echo started",
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=10)
    assert len(limited.pids("sb-p")) <= 6
    assert "fork" in err.lower() or "resource" in err.lower() or proc.returncode != 0
    limited.remove("sb-p")


# ---------------------------------------------------------------- fake cgroup v2 tree
def fake_v2(tmp_path: Path, own: str = "/", root_writable: bool = True) -> tuple[Path, Path]:
    root, proc = tmp_path / "cgroup", tmp_path / "proc"
    root.mkdir()
    proc.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    if root_writable:
        (root / "cgroup.subtree_control").write_text("")
    else:
        (root / "cgroup.subtree_control").mkdir()          # any write fails: treated as not writable
    (proc / "cgroup").write_text(f"0::{own}\n")
    return root, proc


def test_fake_v2_enables_controllers_and_writes_limits(tmp_path):
    root, proc = fake_v2(tmp_path)
    cg = Cgroups(root=str(root), proc_self=str(proc))
    assert (cg.version, cg.available, cg.controllers) == (2, True, {"cpu", "memory", "pids"})
    assert words(root / "cgroup.subtree_control") == {"+cpu", "+memory", "+pids"}
    assert words(root / "orchard" / "cgroup.subtree_control") == {"+cpu", "+memory", "+pids"}
    procs = cg.create("s1", cpu=1.5, memory=1 << 30, pids=100)
    box = root / "orchard" / "s1"
    assert procs == [str(box / "cgroup.procs")]
    assert read(box / "memory.max") == str(1 << 30)
    assert not (box / "memory.swap.max").exists()      # only written where the kernel offers it
    assert read(box / "cpu.max") == "150000 100000"
    assert read(box / "pids.max") == "100"
    assert cg.job("s1", "j1") == [str(box / "j1" / "cgroup.procs")]
    assert not (box / "cgroup.subtree_control").exists()   # nothing enabled below a sandbox
    assert cg.list() == ["s1"]


def test_fake_v2_swap_is_zeroed_when_present(tmp_path):
    root, proc = fake_v2(tmp_path)
    cg = Cgroups(root=str(root), proc_self=str(proc))
    box = root / "orchard" / "s2"
    box.mkdir()
    (box / "memory.swap.max").write_text("max\n")
    cg.create("s2", memory=1 << 20)
    assert read(box / "memory.swap.max") == "0"


def test_fake_v2_cgroup_kill_is_used(tmp_path):
    root, proc = fake_v2(tmp_path)
    cg = Cgroups(root=str(root), proc_self=str(proc))
    cg.create("s3")
    (root / "orchard" / "s3" / "cgroup.kill").write_text("")
    cg.kill("s3")
    assert read(root / "orchard" / "s3" / "cgroup.kill") == "1"


def test_fake_v2_delegates_under_own_cgroup_when_root_is_not_writable(tmp_path):
    root, proc = fake_v2(tmp_path, own="/user.slice/me", root_writable=False)
    own = root / "user.slice" / "me"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpu memory pids\n")
    (own / "cgroup.procs").write_text(f"{os.getpid()}\n")
    cg = Cgroups(root=str(root), proc_self=str(proc))
    assert cg.available, cg.why
    assert read(own / "service" / "cgroup.procs") == str(os.getpid())
    assert words(own / "cgroup.subtree_control") == {"+cpu", "+memory", "+pids"}
    assert words(own / "orchard" / "cgroup.subtree_control") == {"+cpu", "+memory", "+pids"}
    assert cg.create("s4") == [str(own / "orchard" / "s4" / "cgroup.procs")]


def test_v1_without_freezer_is_unavailable(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text("4:memory:/\n")
    (proc / "mountinfo").write_text(
        f"35 31 0:32 / {tmp_path}/memory rw,relatime - cgroup cgroup rw,memory\n")
    cg = Cgroups(root=str(tmp_path), proc_self=str(proc))
    assert (cg.version, cg.available) == (1, False) and "freezer" in cg.why
    with pytest.raises(BackendError):
        cg.create("s5")
    assert cg.list() == [] and cg.pids("s5") == [] and cg.memory_used("s5") is None


def test_a_rejected_limit_leaves_nothing_behind(limited):
    with pytest.raises(BackendError) as e:
        limited.create("sb-x", pids=-1)
    assert "pids.max" in e.value.detail
    assert limited.list() == []
