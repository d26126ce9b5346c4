"""From inside a sandbox: escape or exhaust its limits (cgroups, pids, memory, disk, CPU)."""

from __future__ import annotations

import base64
import glob
import os
import secrets
import time
from contextlib import contextmanager

import pytest

from orchard import PayloadTooLargeError

from .conftest import IMAGE, local_only, run_py


def _cgroup_mount(controller: str) -> str:
    """Where the host mounts a cgroup v1 controller."""
    with open("/proc/mounts") as f:
        for line in f:
            dev, point, fstype, opts = line.split()[:4]
            if fstype == "cgroup" and controller in opts.split(","):
                return point
    pytest.skip(f"no cgroup v1 {controller} controller mounted on this host")


@contextmanager
def _then(check):
    """Run ``check`` (the service still serves others) however the block ends."""
    try:
        yield
    finally:
        check()


def _host_pid_of(argv: list[str], timeout: float = 10.0) -> int:
    """The host pid of the process running exactly ``argv`` (not the helper that started it)."""
    wanted = b"\0".join(a.encode() for a in argv) + b"\0"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/cmdline", "rb") as f:
                        if f.read() == wanted:
                            return int(entry)
                except OSError:
                    continue
        time.sleep(0.1)
    raise AssertionError(f"no host process runs {argv}")


# Mount the sandbox's own cgroup hierarchies from a nested user + cgroup namespace (the only way a
# process without capabilities could get at cgroupfs) and try to leave them or loosen them.
USERNS_CGROUPS = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
NEWUSER, NEWNS, NEWCGROUP = 0x10000000, 0x20000, 0x2000000
print("before", open("/proc/self/cgroup").read().replace("\\n", ";"))
mounted = {}
if libc.unshare(NEWUSER | NEWNS | NEWCGROUP) == 0:
    libc.mount(b"none", b"/", None, 0x4000 | 0x40000, None)
    for ctrl, point in (("memory", "/home"), ("pids", "/root"), ("cpu", "/run"), ("freezer", "/var")):
        if libc.mount(b"none", point.encode(), b"cgroup", 0, ctrl.encode()) == 0:
            mounted[ctrl] = point
print("mounted", sorted(mounted))
def write(path, value):
    try:
        with open(path, "w") as f:
            f.write(value)
        print("WROTE", path, value)
    except OSError as e:
        print("refused", path, e.errno)
ACTION
"""


@local_only
def test_a_process_cannot_leave_its_cgroups(client, http, service_ok):
    """Moving itself out of its cgroups (through /sys/fs/cgroup or a fresh cgroupfs mount): refused; membership checked from the host."""
    marker = "cg-escape-" + secrets.token_hex(4)
    code = USERNS_CGROUPS.replace("ACTION", f"""
for p in ("/sys/fs/cgroup/cgroup.procs", "/sys/fs/cgroup/memory/cgroup.procs", "/sys/fs/cgroup/pids/tasks"):
    write(p, str(os.getpid()))
for ctrl, point in mounted.items():
    write(point + "/cgroup.procs", str(os.getpid()))          # the namespace root: as high as it can see
    for sub in os.listdir(point):
        if os.path.isdir(point + "/" + sub):
            write(point + "/" + sub + "/cgroup.procs", str(os.getpid()))
open("/tmp/{marker}", "w").write("done")
import time
time.sleep(30)
""")
    with client.create_sandbox(IMAGE) as sb:
        sb.upload_content(code, f"/tmp/{marker}.py")
        job = http.post(f"/sandboxes/{sb.sandbox_id}/exec",
                        json={"command": ["python3", f"/tmp/{marker}.py"], "timeout_seconds": 60})
        assert job.status_code == 200, job.text
        pid = _host_pid_of(["python3", f"/tmp/{marker}.py"])
        deadline = time.monotonic() + 20
        while http.get(f"/sandboxes/{sb.sandbox_id}/files", params={"path": f"/tmp/{marker}"}).status_code != 200:
            assert time.monotonic() < deadline, "the attack script did not finish its attempts"
            time.sleep(0.2)
        with open(f"/proc/{pid}/cgroup") as f:
            membership = {line.split(":")[1]: line.strip().split(":", 2)[2] for line in f}
        for ctrl in ("memory", "pids", "cpu", "freezer"):
            key = next((k for k in membership if ctrl in k.split(",")), None)
            if key is not None:
                assert f"/{sb.sandbox_id}" in membership[key], (ctrl, membership)
    service_ok()


@local_only
def test_user_namespace_cannot_raise_the_sandboxs_own_limits(client, service_ok):
    """A new user + cgroup namespace to mount cgroupfs and raise the sandbox's own memory and pids limits: refused by the seccomp filter; the limits stay."""
    code = USERNS_CGROUPS.replace("ACTION", """
if "memory" in mounted:
    write(mounted["memory"] + "/memory.limit_in_bytes", str(2**30))
    write(mounted["memory"] + "/memory.memsw.limit_in_bytes", str(2**30))
if "pids" in mounted:
    write(mounted["pids"] + "/pids.max", "max")
sys.stdout.flush()
kids = 0
try:
    for _ in range(300):                       # over the 256-pid limit
        pid = os.fork()
        if pid == 0:
            import time; time.sleep(5); os._exit(0)
        kids += 1
except OSError:
    pass
print("forked", kids)
sys.stdout.flush()
block = bytearray(200 * 2**20)                 # over the 64 MiB limit
for i in range(0, len(block), 4096):
    block[i] = 1
print("memory-hog-survived")
""")
    with client.create_sandbox(IMAGE, memory="64Mi") as sb, _then(service_ok):
        r = run_py(sb, code, timeout=60)
        before = next(line for line in r.stdout.splitlines() if line.startswith("before"))
        paths = dict(part.split(":")[1:] for part in before.split(" ", 1)[1].split(";") if part.count(":") == 2)
        limit = open(os.path.join(_cgroup_mount("memory") + paths["memory"], "memory.limit_in_bytes")).read()
        pids_max = open(os.path.join(_cgroup_mount("pids") + paths["pids"], "pids.max")).read()
        assert int(limit) == 64 * 2**20 and pids_max.strip() == "256", (limit, pids_max, r.stdout)
        assert "WROTE" not in r.stdout, r.stdout
        assert "memory-hog-survived" not in r.stdout
        forked = [int(line.split()[1]) for line in r.stdout.splitlines() if line.startswith("forked")]
        assert not forked or forked[0] < 256       # the hog may be OOM-killed before it reports
        assert sb.exec("echo alive").stdout == "alive\n"


def test_fork_bomb_is_contained_and_the_sandbox_recovers(client, http, bystander, service_ok):
    """A shell fork bomb in the foreground of a job: others keep working, the timeout takes every bomb
    process (they are all in the job's tree), and the sandbox is usable again."""
    with client.create_sandbox(IMAGE) as sb:
        queued = http.post(f"/sandboxes/{sb.sandbox_id}/exec",
                           json={"command": ":(){ :|:& };: ; sleep 60", "timeout_seconds": 4}).json()
        time.sleep(1.0)                              # the bomb is at its limit now
        t0 = time.monotonic()
        assert bystander.exec("echo fine").stdout == "fine\n"
        assert time.monotonic() - t0 < 10, "another tenant's exec stalled during a fork bomb"
        with client.create_sandbox(IMAGE) as third:         # creating sandboxes still works
            assert third.exec("echo made").stdout == "made\n"
        job = http.get(f"/jobs/{queued['job_id']}/wait", params={"timeout": 60}).json()
        assert job["status"] == "failed" and job["exit_code"] == 124, job
        r = sb.exec("ps -e --no-headers | wc -l; echo usable", timeout=20)
        assert r.stdout.endswith("usable\n") and int(r.stdout.split()[0]) < 10, r
    service_ok()


@local_only
def test_detached_fork_bomb_dies_with_its_sandbox(client, http, bystander, service_ok):
    """A fork bomb that outlives its job (the shell returns at once) stays inside the sandbox's pids
    limit, and deleting the sandbox leaves no process and no cgroup behind."""
    pids_mount = _cgroup_mount("pids")
    sb = client.create_sandbox(IMAGE)
    try:
        r = sb.exec(":(){ :|:& };:", timeout=10)
        assert r.exit_code == 0, r
        time.sleep(1.5)
        [group] = glob.glob(f"{pids_mount}/orchard-*/{sb.sandbox_id}")
        assert int(open(f"{group}/pids.current").read()) <= 256
        t0 = time.monotonic()
        assert bystander.exec("echo fine").stdout == "fine\n"
        assert time.monotonic() - t0 < 10
    finally:
        sb.delete()
    deadline = time.monotonic() + 20
    while os.path.exists(group):
        assert time.monotonic() < deadline, f"{group} still exists after delete: " + open(f"{group}/cgroup.procs").read()
        time.sleep(0.2)
    service_ok()


def test_cpu_and_memory_hogs_do_not_starve_other_sandboxes(client, http, bystander, service_ok):
    """CPU and memory hogs in one sandbox: another key's commands keep their latency; each OOM stays confined to the hog."""
    hog = """
import os, time
end = time.time() + 4
for _ in range(3):
    if os.fork() == 0:
        while time.time() < end:
            pass
        os._exit(0)
killed = 0
while time.time() < end:              # keep getting OOM-killed children, as a leak would
    if os.fork() == 0:
        x = bytearray(256 * 2**20)
        os._exit(0)
    _, status = os.wait()
    killed += os.WIFSIGNALED(status) and os.WTERMSIG(status) == 9
print("oom-killed", killed)
"""
    with client.create_sandbox(IMAGE, memory="64Mi") as sb:
        sb.upload_content(hog, "/tmp/hog.py")
        queued = http.post(f"/sandboxes/{sb.sandbox_id}/exec",
                           json={"command": ["python3", "/tmp/hog.py"], "timeout_seconds": 30}).json()
        time.sleep(0.5)
        worst = 0.0
        for _ in range(5):
            t0 = time.monotonic()
            assert bystander.exec(["echo", "fine"], timeout=30).stdout == "fine\n"
            worst = max(worst, time.monotonic() - t0)
            time.sleep(0.3)
        assert worst < 5, f"another tenant's exec took {worst:.1f}s while a hog ran"
        job = http.get(f"/jobs/{queued['job_id']}/wait", params={"timeout": 60}).json()
        assert job["status"] == "succeeded" and int(job["stdout"].split()[-1]) >= 1, job     # each hog was killed
        assert sb.exec("echo survived-its-own-hog").stdout == "survived-its-own-hog\n"
    service_ok()


def test_memory_backed_dirs_are_charged_to_the_sandbox(client, service_ok):
    """/dev/shm and /dev are tmpfs without a size: filling them must hit the sandbox's memory limit,
    never the host's memory."""
    with client.create_sandbox(IMAGE, memory="128Mi") as sb:
        r = sb.exec("dd if=/dev/zero of=/dev/shm/fill bs=1M count=600 2>&1; echo rc=$?", timeout=60)
        assert "rc=0" not in r.stdout, r
        r = sb.exec("dd if=/dev/zero of=/dev/fill bs=1M count=600 2>&1; echo rc=$?", timeout=60)
        assert "rc=0" not in r.stdout, r
        sb.exec("rm -f /dev/shm/fill /dev/fill")
        assert sb.exec("echo recovered").stdout == "recovered\n"
    service_ok()


def test_disk_limit_spans_every_writable_path_and_the_file_api(client, http, service_ok):
    """The 256 MiB writable layer is one budget for /, /tmp, /usr, /etc and uploads: going past it is
    ENOSPC inside and 413 through the API, and the sandbox is usable again once the files go."""
    with client.create_sandbox(IMAGE) as sb:
        r = sb.exec("dd if=/dev/zero of=/tmp/a bs=1M count=150 2>/dev/null; "
                    "dd if=/dev/zero of=/usr/b bs=1M count=150 2>&1 | grep -c 'No space left'; "
                    "dd if=/dev/zero of=/etc/c bs=1M count=20 2>&1 | grep -c 'No space left'", timeout=60)
        assert r.stdout.split() == ["1", "1"], r
        with pytest.raises(PayloadTooLargeError):
            sb.upload_content(b"x" * (3 * 2**20), "/workspace/upload.bin")
        r = http.post(f"/sandboxes/{sb.sandbox_id}/files",
                      json={"path": "/opt/more.bin", "content": base64.b64encode(b"y" * 2**20).decode()})
        assert r.status_code == 413, r.text
        sb.exec("rm -f /tmp/a /usr/b /etc/c")
        assert sb.upload_content(b"z" * 2**20, "/workspace/ok.bin").size == 2**20
        assert sb.exec("echo ok > /tmp/ok && cat /tmp/ok").stdout == "ok\n"
    service_ok()


def test_uploads_count_against_the_sandboxs_memory(client, service_ok):
    """Parking 100 MiB in a 64 MiB sandbox through uploads: the writer runs inside the sandbox's cgroups, so the memory limit stops it (413)."""
    try:
        with client.create_sandbox(IMAGE, memory="64Mi") as sb:
            accepted = 0
            try:
                for i in range(25):                  # 100 MiB, well inside the 256 MiB disk, over the 64 MiB memory
                    sb.upload_content(b"x" * (4 * 2**20 - 64), f"/workspace/f{i}")
                    accepted += 1
            except PayloadTooLargeError:
                pass
            assert accepted * 4 < 64 + 8, f"{accepted * 4} MiB of uploads held by a 64 MiB sandbox"
    finally:
        service_ok()
