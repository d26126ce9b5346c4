"""From inside a sandbox: reach a listener on the host (loopback, the host's own addresses, the service).

Only addresses of this machine are ever tried: loopback and the interface addresses `ip -4 -o addr`
lists here.
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
import time
from contextlib import contextmanager

import pytest

from .conftest import IMAGE, host_ipv4, local_only, run_py


@contextmanager
def host_listeners():
    """TCP on 127.0.0.1 and 0.0.0.0, UDP on 0.0.0.0, an abstract unix socket; records every contact."""
    contacts: list[str] = []
    socks = []
    tcp_lo = socket.create_server(("127.0.0.1", 0))
    tcp_any = socket.create_server(("0.0.0.0", 0))
    udp_any = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp_any.bind(("0.0.0.0", 0))
    abstract = "\0orchard-attack-" + secrets.token_hex(6)
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(abstract)
    unix.listen()
    socks = [tcp_lo, tcp_any, udp_any, unix]
    stop = threading.Event()

    def serve(s: socket.socket, label: str) -> None:
        s.settimeout(0.2)
        while not stop.is_set():
            try:
                if s.type == socket.SOCK_DGRAM:
                    _, peer = s.recvfrom(64)
                else:
                    conn, peer = s.accept()
                    conn.close()
                contacts.append(f"{label} from {peer!r}")
            except (socket.timeout, OSError):
                continue

    threads = [threading.Thread(target=serve, args=(s, n), daemon=True)
               for s, n in zip(socks, ("tcp-127", "tcp-any", "udp-any", "unix-abstract"))]
    for t in threads:
        t.start()
    ports = {"tcp_lo": tcp_lo.getsockname()[1], "tcp_any": tcp_any.getsockname()[1],
             "udp_any": udp_any.getsockname()[1], "abstract": abstract[1:]}
    try:
        yield ports, contacts
    finally:
        stop.set()
        for t in threads:
            t.join(2)
        for s in socks:
            s.close()


PROBE = """
import json, socket, threading
cfg = json.load(open("/tmp/probe.json"))
reached = []
def tcp(addr, port):
    try:
        socket.create_connection((addr, port), timeout=1).close()
        reached.append("tcp %s:%d" % (addr, port))
    except OSError:
        pass
threads = [threading.Thread(target=tcp, args=(a, p)) for a in cfg["addrs"] for p in cfg["tcp_ports"]]
for t in threads:
    t.start()
for t in threads:
    t.join()
for addr in cfg["addrs"]:
    try:
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"ping", (addr, cfg["udp_port"]))
    except OSError:
        pass
try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("\\0" + cfg["abstract"])
    reached.append("unix-abstract")
except OSError:
    pass
print("interfaces", sorted(n for _, n in socket.if_nameindex()))
print("reached", json.dumps(reached))
"""


def probe_host(sb, service, model_port: int):
    """What a sandbox reaches among the host's listeners; (interfaces line, reached, contacts)."""
    service_port = int(service.url.rsplit(":", 1)[1])
    with host_listeners() as (ports, contacts):
        cfg = {"addrs": host_ipv4(), "tcp_ports": [ports["tcp_lo"], ports["tcp_any"], service_port, model_port],
               "udp_port": ports["udp_any"], "abstract": ports["abstract"]}
        sb.upload_content(json.dumps(cfg), "/tmp/probe.json")
        r = run_py(sb, PROBE, timeout=120)
        time.sleep(0.5)                            # let a datagram that got through be counted
        seen = list(contacts)
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
    assert "reached" in lines, r
    return lines["interfaces"], json.loads(lines["reached"]), seen


@local_only
def test_blocked_network_reaches_nothing_on_the_host(sandbox, service, model_server, service_ok):
    """With block_network: reaching host listeners (TCP, UDP, abstract unix) on every host address and the service's port: only lo exists."""
    interfaces, reached, contacts = probe_host(sandbox, service, model_server)
    assert interfaces == "['lo']"
    assert reached == [] and contacts == [], (reached, contacts)
    service_ok()


@local_only
def test_networked_sandbox_still_cannot_reach_host_listeners(client, service, model_server, service_ok):
    """Without block_network: reaching host listeners on every host address and the bridge gateway: dropped by the sandbox firewall."""
    with client.create_sandbox(IMAGE, block_network=False) as sb:
        interfaces, reached, contacts = probe_host(sb, service, model_server)
    service_ok()
    assert reached == [] and contacts == [], (reached, contacts)


LISTEN = """
import os, socket, sys
s = socket.create_server(("0.0.0.0", 0))
open("/tmp/port", "w").write(str(s.getsockname()[1]))
if os.fork():
    os._exit(0)
os.setsid()
for fd in (0, 1, 2):
    os.close(fd)
s.settimeout(60)
while True:
    try:
        c, _ = s.accept()
        c.sendall(b"PEER-REACHED")
        c.close()
    except OSError:
        break
"""


def _eth0_address(sb) -> str:
    r = sb.exec("ip -4 -o addr show eth0")
    return r.stdout.split()[3].split("/")[0]


@local_only
def test_networked_sandboxes_cannot_reach_each_other(client, tenant_b, service_ok):
    """Two networked sandboxes (of two tenants) sit on the same host bridge: neither reaches a listener
    of the other, nor a blocked sandbox's loopback listener."""
    connect = "import socket,sys; print(socket.create_connection((sys.argv[1], int(sys.argv[2])), 1).recv(64))"
    with tenant_b.create_sandbox(IMAGE, block_network=False) as peer, \
            client.create_sandbox(IMAGE, block_network=False) as attacker, client.create_sandbox(IMAGE) as blocked:
        peer.upload_content(LISTEN, "/tmp/listen.py")
        assert peer.exec(["python3", "/tmp/listen.py"]).exit_code == 0
        port = peer.download_content("/tmp/port").decode()
        ip = _eth0_address(peer)
        own = peer.exec(["python3", "-c", connect, ip, port], timeout=20)
        assert "PEER-REACHED" in own.stdout, own                   # the listener is up, seen from its own sandbox
        gateway = attacker.exec("ip -4 route show default").stdout.split()[2]
        for target in (ip, gateway):                                # the peer; the host's end of the bridge
            r = attacker.exec(["python3", "-c", connect, target, port], timeout=20)
            assert r.exit_code != 0 and "PEER-REACHED" not in r.stdout, (target, r)
        r = blocked.exec(["python3", "-c", connect, ip, port], timeout=20)
        assert r.exit_code != 0 and "PEER-REACHED" not in r.stdout, r
    service_ok()
