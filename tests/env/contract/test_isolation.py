"""What a sandbox must not see or reach, and limits that hold."""

from __future__ import annotations

import subprocess

from .conftest import IMAGE


def test_host_data_is_not_visible(sandbox):
    r = sandbox.exec("ls /work /home/* /var/lib/orchard 2>&1; cat /etc/shadow 2>&1; ls /root; echo end")
    assert "No such file" in r.stdout and r.stdout.strip().endswith("end")
    assert "root:" not in r.stdout


def test_no_network_but_loopback(sandbox, service):
    port = service.url.rsplit(":", 1)[1]
    r = sandbox.exec("cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '")
    assert r.stdout.split() == ["lo"]
    r = sandbox.exec(["python3", "-c", f"import socket; socket.create_connection(('127.0.0.1', {port}), 2)"])
    assert r.exit_code != 0


def test_processes_and_privileges(sandbox):
    r = sandbox.exec("ps -eo pid,args | wc -l; grep CapEff /proc/self/status; mount -t tmpfs x /mnt 2>&1; echo rc=$?")
    assert "CapEff:\t0000000000000000" in r.stdout and "rc=0" not in r.stdout
    assert int(r.stdout.split()[0]) < 10     # only the sandbox's own processes are visible


FORK_BOMB = """
import os, time
n = 0
try:
    while n < 2000:
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        n += 1
except OSError:
    pass
print(n)
"""


def test_pids_limit_contains_a_fork_bomb(client, http):
    with client.create_sandbox(IMAGE) as sb:
        r = sb.exec(["python3", "-c", FORK_BOMB], timeout=60)
        assert r.stdout.strip() and int(r.stdout.strip()) < 256, r
    assert http.get("/health").status_code == 200
    assert http.get("/health").status_code == 200


def test_memory_limit_contains_a_hog(client, http):
    with client.create_sandbox(IMAGE, memory="64Mi") as sb:
        r = sb.exec(["python3", "-c", "x = bytearray(512 * 2**20); print('survived')"], timeout=60)
        assert r.exit_code != 0 and "survived" not in r.stdout
        assert sb.exec("echo still-here").stdout == "still-here\n"


def test_model_endpoint_reaches_only_its_target(client, model_server):
    with client.create_sandbox(IMAGE, model_endpoint={"port": 8000, "target": f"127.0.0.1:{model_server}"}) as sb:
        code = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8000/v1', timeout=5).read().decode())"
        r = sb.exec(["python3", "-c", code])
        assert r.stdout.strip() == "model-endpoint-ok", r.stderr
        direct = sb.exec(["python3", "-c", f"import socket; socket.create_connection(('127.0.0.1', {model_server}), 2)"])
        assert direct.exit_code != 0


def test_model_endpoint_outside_allowlist_is_refused(http):
    r = http.post("/sandboxes", json={"image": IMAGE, "model_endpoint": {"port": 8000, "target": "127.0.0.1:22"}})
    assert r.status_code == 422 and "allowlist" in r.json()["detail"]



def test_disk_filler_is_contained(client, http):
    with client.create_sandbox(IMAGE) as sb:
        r = sb.exec("dd if=/dev/zero of=/workspace/fill bs=1M count=400 2>&1; echo rc=$?", timeout=120)
        assert "No space left" in r.stdout and "rc=0" not in r.stdout
        sb.exec("rm -f /workspace/fill")
        assert sb.exec("echo ok > /workspace/small && cat /workspace/small").stdout == "ok\n"
    assert http.get("/health").status_code == 200


def _host_addresses() -> list[str]:
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    return [line.split()[3].split("/")[0] for line in out.splitlines()]


def test_networked_sandbox_cannot_reach_the_host(client, service):
    port = service.url.rsplit(":", 1)[1]
    with client.create_sandbox(IMAGE, block_network=False) as sb:
        r = sb.exec("ip -4 -o addr show eth0 2>/dev/null || cat /proc/net/dev")
        assert "eth0" in r.stdout
        for host in _host_addresses():             # loopback, this machine's interfaces, the bridge gateway
            code = f"import socket; socket.create_connection(('{host}', {port}), 1)"
            assert sb.exec(["python3", "-c", code], timeout=20).exit_code != 0, host
