"""From inside a sandbox: see, signal, trace or enter host processes (pids guessed on the host side)."""

from __future__ import annotations

import os

from .conftest import local_only, run_py


@local_only
def test_ps_shows_only_the_sandboxs_own_processes(sandbox, service, host_sleep, service_ok):
    """Seeing host processes: ps shows only the sandbox's own (own pid namespace)."""
    marker = host_sleep.args[1]
    r = sandbox.exec("ps -eo pid,args; echo ---; ls /proc | grep -E '^[0-9]+$' | sort -n | tr '\\n' ' '")
    table, pids = r.stdout.split("---\n")
    assert marker not in table and "orchard" not in table.replace("orchard-init", "")
    assert "uvicorn" not in table and "bwrap" not in table and "pytest" not in table
    listed = [int(p) for p in pids.split()]
    assert listed and max(listed) < 100, listed       # a fresh pid namespace: small numbers only
    for host_pid in (os.getpid(), service.proc.pid, host_sleep.pid):
        assert host_pid not in listed or host_pid < 100
    service_ok()


@local_only
def test_host_processes_cannot_be_signalled(sandbox, service, host_sleep, service_ok):
    """Signalling host processes (kill -9 <host pid>, kill -1): they are invisible; the host process survives."""
    targets = [host_sleep.pid, os.getpid(), service.proc.pid]
    code = f"""
import os, signal
for pid in {targets!r}:
    for how in ("kill", "pidfd"):
        try:
            if how == "kill":
                os.kill(pid, 0)
            else:
                os.close(os.pidfd_open(pid))
            print("REACHED", how, pid)
        except OSError as e:
            print("refused", how, pid, e.errno)
"""
    r = run_py(sandbox, code)
    assert "refused" in r.stdout and "REACHED" not in r.stdout, r
    # and then with brute force: signal every host pid named, every pid the namespace has, and -1
    sandbox.exec(f"kill -9 {' '.join(map(str, targets))}; pkill -9 sleep; kill -9 -1; echo done", timeout=30)
    assert host_sleep.poll() is None, "a host process was killed from inside a sandbox"
    assert service.proc.poll() is None
    assert sandbox.exec("echo still-usable").stdout == "still-usable\n"
    service_ok()


@local_only
def test_host_processes_cannot_be_traced_read_or_entered(sandbox, service, host_sleep, host_secret, service_ok):
    """ptrace, process_vm_readv, pidfd_open and nsenter on host processes: refused."""
    secret, token = host_secret
    targets = [host_sleep.pid, service.proc.pid, os.getpid()]
    code = f"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH, PTRACE_SEIZE = 16, 0x4206
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buf = ctypes.create_string_buffer(16)
local, remote = iovec(ctypes.addressof(buf), 16), iovec(0x400000, 16)
for pid in {targets!r} + [1]:
    for name, call in (("attach", lambda: libc.ptrace(PTRACE_ATTACH, pid, 0, 0)),
                       ("seize", lambda: libc.ptrace(PTRACE_SEIZE, pid, 0, 0)),
                       ("vm_readv", lambda: libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0))):
        if call() >= 0:
            print("TRACED", name, pid)
        else:
            print("refused", name, pid, ctypes.get_errno())
    for f in ("root{secret}", "cwd", "environ", "mem", "maps", "ns/mnt", "exe"):
        try:
            p = "/proc/%d/%s" % (pid, f)
            data = open(p, "rb").read(4096) if not f.startswith(("cwd", "ns")) else os.listdir(p)
            print("LEAKED" if pid != 1 else "init-readable", p, repr(data)[:80])
        except OSError as e:
            print("refused", pid, f, e.errno)
"""
    r = run_py(sandbox, code)
    assert "refused" in r.stdout, r
    assert "TRACED" not in r.stdout and "LEAKED" not in r.stdout and token not in r.stdout, r.stdout
    # the sandbox's init keeps its capabilities; nothing can borrow them through it or enter its namespaces again
    r = sandbox.exec("nsenter -t 1 -a true 2>&1; echo rc=$?; gdb -p 1 -batch 2>&1 | tail -1; "
                     "cat /proc/1/environ 2>&1; echo; grep CapEff /proc/self/status")
    assert "rc=0" not in r.stdout and "CapEff:\t0000000000000000" in r.stdout, r
    assert host_sleep.poll() is None
    service_ok()
