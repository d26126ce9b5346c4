"""From inside a sandbox: reach a host file through links, `..`, /proc, hard links, /sys or /dev."""

from __future__ import annotations

import hashlib
import os
import stat

from .conftest import IMAGE, local_only, run_py


@local_only
def test_links_dotdot_and_proc_roots_never_reach_host_files(sandbox, host_secret, service_ok):
    """From inside: symlinks, '..' chains, /proc/<pid>/root, /proc/1/root, /proc/self/root/../..: only the sandbox's own files."""
    secret, token = host_secret
    d = secret.parent
    r = sandbox.exec(
        f"ln -s {secret} /workspace/abs; ln -s ../../../../../../../../..{secret} /workspace/rel; "
        f"mkdir -p /workspace/a/b/c; ln -s ../../../../../../../../.. /workspace/a/b/c/up; "
        f"ln -s /workspace/loop2 /workspace/loop1; ln -s /workspace/loop1 /workspace/loop2; "
        f"for p in /workspace/abs /workspace/rel /workspace/a/b/c/up{secret} /workspace/loop1 "
        f"  /../../../../..{secret} {secret} //{secret} /./.././..{d}/./host-secret.txt "
        f"  /proc/self/root/../..{secret} /proc/self/root/../../..{secret} /proc/1/root{secret} "
        f"  /proc/1/root/../..{secret} /proc/self/cwd/../../../..{secret} /proc/thread-self/root{secret} "
        f"  /dev/fd/../../..{secret}; do cat \"$p\" 2>&1; done; "
        f"cd /workspace/a/b/c && cat ../../../../../../../../../..{secret} 2>&1; "
        f"echo SEARCH; ls -a {d} /proc/self/root{d} 2>/dev/null; find / -xdev -name host-secret.txt 2>/dev/null; "
        f"echo end")
    assert r.stdout.rstrip().endswith("end"), r
    assert token not in r.stdout + r.stderr
    assert r.stdout.split("SEARCH\n")[1] == "end\n", r.stdout      # the host directory is not there at all
    service_ok()


@local_only
def test_state_dir_and_work_are_not_reachable(sandbox, service, bystander, service_ok):
    """The service's own paths (state dir, SQLite, other sandboxes' layers, /work) do not exist inside."""
    state = str(service.state_dir)
    bystander.exec("echo BYSTANDER-PRIVATE > /workspace/private.txt")
    targets = [state, f"{state}/sandboxes", f"{state}/sandboxes/{bystander.sandbox_id}",
               f"{state}/sandboxes/{bystander.sandbox_id}/layer/upper/root/workspace/private.txt",
               f"{state}/images", "/work", "/work/main", "/work/main/README.md", "/work/shared",
               f"/proc/self/root{state}", f"/proc/1/root/work/main/README.md"]
    code = f"""
import os, glob
for t in {targets!r}:
    try:
        if os.path.isdir(t):
            print("VISIBLE-DIR", t, os.listdir(t)[:5])
        else:
            print("VISIBLE-FILE", t, open(t, "rb").read(64))
    except OSError as e:
        print("refused", t, e.errno)
# every path the mount table names (it shows the host paths of the layers) must be absent too
for line in open("/proc/self/mountinfo"):
    for word in line.replace(",", " ").replace("=", " ").replace(":", " ").split():
        if word.startswith({state!r}) and os.path.exists(word):
            print("VISIBLE-LAYER", word)
print(glob.glob("/**/private.txt", recursive=False), "end")
"""
    r = run_py(sandbox, code)
    assert r.stdout.rstrip().endswith("end"), r
    assert "VISIBLE" not in r.stdout and "BYSTANDER-PRIVATE" not in r.stdout, r.stdout
    assert bystander.exec("cat /workspace/private.txt").stdout == "BYSTANDER-PRIVATE\n"
    service_ok()


@local_only
def test_hard_links_and_writes_to_image_files_stay_in_the_sandbox(client, service, service_ok):
    """A hard link to an image file (host /usr, the service's filtered /etc) then a write, or a metadata
    change, touches only the sandbox's own copy: not the host, not the image, not the next sandbox."""
    env_before = os.stat("/usr/bin/env")
    etc_copies = [p for p in (service.state_dir / "images").rglob("hostname") if p.is_file()]
    etc_before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in etc_copies}
    with client.create_sandbox(IMAGE) as sb:
        original = sb.exec("cat /etc/hostname").stdout
        r = sb.exec("ln /etc/hostname /etc/hl && echo PWNED >> /etc/hl; echo PWNED >> /etc/hostname; "
                    "ln /usr/bin/env /usr/hl-env && touch -m -d 2001-01-01 /usr/hl-env && chmod 4777 /usr/hl-env; "
                    "ln /usr/bin/env /workspace/x 2>&1; ln /proc/self/status /workspace/y 2>&1; "
                    "ln /dev/null /workspace/z 2>&1; echo end")
        assert r.stdout.rstrip().endswith("end"), r
        assert "PWNED" in sb.exec("cat /etc/hostname").stdout       # its own copy did change
    after = os.stat("/usr/bin/env")
    assert (after.st_mtime, after.st_mode, after.st_ino) == (env_before.st_mtime, env_before.st_mode, env_before.st_ino)
    assert not os.path.exists("/usr/hl-env") and not os.path.exists("/etc/hl")
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in etc_copies} == etc_before
    with client.create_sandbox(IMAGE) as fresh:
        assert fresh.exec("cat /etc/hostname").stdout == original
        assert fresh.exec("test -e /usr/hl-env || echo clean").stdout == "clean\n"
        assert not stat.S_ISUID & int(fresh.exec("stat -c %a /usr/bin/env").stdout.strip(), 8)
    service_ok()


def test_no_host_devices_and_no_sysfs(sandbox, service_ok):
    """No disk, memory, kernel-log or port device can be found, made or read; /sys shows nothing."""
    st = os.stat("/")
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    code = f"""
import os, stat
found = []
for p in ("/dev/sda", "/dev/vda", "/dev/nvme0n1", "/dev/xvda", "/dev/mem", "/dev/kmem", "/dev/port",
          "/dev/kmsg", "/dev/mapper", "/dev/loop0", "/dev/fuse", "/dev/net/tun", "/dev/kvm", "/dev/sg0",
          "/dev/console", "/dev/tty0", "/dev/ttyS0", "/dev/vsock", "/dev/nvidia0", "/proc/kcore",
          "/sys/block", "/sys/class", "/sys/devices", "/sys/fs/cgroup", "/sys/kernel", "/sys/firmware"):
    if os.path.exists(p):
        found.append(p)
for p in ("/dev/kmsg", "/proc/kmsg", "/proc/kcore", "/dev/mem"):
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
        found.append("READABLE " + p)
        os.close(fd)
    except OSError:
        pass
for name, kind, dev in (("sda", stat.S_IFBLK, os.makedev(8, 0)), ("root", stat.S_IFBLK, os.makedev({major}, {minor})),
                        ("mem", stat.S_IFCHR, os.makedev(1, 1)), ("kmsg", stat.S_IFCHR, os.makedev(1, 11))):
    try:
        os.mknod("/tmp/" + name, kind | 0o600, dev)
        found.append("MKNOD " + name)
    except OSError:
        pass
# the only device nodes are the harmless ones bubblewrap provides
for entry in os.listdir("/dev"):
    st = os.lstat("/dev/" + entry)
    if stat.S_ISBLK(st.st_mode) or (stat.S_ISCHR(st.st_mode) and entry not in
                                     ("null", "zero", "full", "random", "urandom", "tty")):
        found.append("DEVICE " + entry)
print("sys:", sorted(os.listdir("/sys")) if os.path.isdir("/sys") else [])
# kernel addresses are hidden from the sandbox
syms = [l.split()[0] for l in open("/proc/kallsyms").read().splitlines()[:200]]
if any(int(a, 16) for a in syms):
    found.append("KALLSYMS")
print("found:", found)
"""
    r = run_py(sandbox, code)
    assert "found: []" in r.stdout and "sys: []" in r.stdout, r
    r = sandbox.exec("dmesg 2>&1 | head -3; echo rc=${PIPESTATUS[0]}")
    assert "rc=0" not in r.stdout, r
    service_ok()
