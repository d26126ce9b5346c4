"""Sandbox networking on real namespaces: out through NAT, but no host, sandbox or private address answers.

All traffic stays on this machine. The "world" is a network namespace of our own behind a veth
(otest0) holding a TEST-NET-3 address and, to show they are blocked, a few private ones; the
host gets /32 routes to exactly those addresses, removed with the veth at the end.
"""

from __future__ import annotations

import errno
import json
import os
import select
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import pytest

from orchard.env.backends import local_net
from orchard.env.backends.local_net import SandboxNetwork, in_netns, veth_name
from orchard.errors import BackendError

BRIDGE, SUBNET, GATEWAY = "orchtest0", "10.232.0.0/16", "10.232.0.1"
OUTSIDE = "otest0"                                  # host end of the veth to the stand-in world
WORLD, WORLD_HOST = "203.0.113.2", "203.0.113.1"    # TEST-NET-3, held by namespaces on this machine
PRIVATE = ["10.99.231.2", "172.31.231.2", "192.168.231.2", "100.64.231.2", "169.254.231.2"]
DNAT_TABLE = "orchtest_dnat"


# ---------------------------------------------------------------- helpers
def sh(*argv: str, stdin: str = "") -> str:
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, check=True).stdout


def spawn_netns(procs: list[subprocess.Popen]) -> int:
    """A process in a network namespace of its own; returns its pid."""
    proc = subprocess.Popen(["unshare", "--net", "sleep", "300"])
    procs.append(proc)
    home, deadline = os.readlink("/proc/self/ns/net"), time.monotonic() + 5
    while os.readlink(f"/proc/{proc.pid}/ns/net") == home:
        assert time.monotonic() < deadline, "unshare did not make a network namespace"
        time.sleep(0.001)
    return proc.pid


def kill(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.kill()
        proc.wait()


def inside(pid: int, command: str) -> str:
    return sh("nsenter", "-t", str(pid), "-n", *command.split())


def socket_in(pid: Optional[int]) -> socket.socket:
    """A TCP socket of the network namespace of pid (the host's when None); it stays there."""
    if pid is None:
        return socket.socket()
    box: list[socket.socket] = []
    in_netns(pid, lambda: box.append(socket.socket()))
    return box[0]


def listen(pid: Optional[int]) -> tuple[socket.socket, int]:
    """A listener on 0.0.0.0 in pid's namespace; returns it and its port."""
    sock = socket_in(pid)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("0.0.0.0", 0))
    sock.listen(64)
    return sock, sock.getsockname()[1]


def reached(pid: Optional[int], targets: list[tuple[str, int]], timeout: float = 1.0) -> set[str]:
    """The addresses among targets that a TCP connect from pid's namespace reaches, all tried at once."""
    pending: dict[int, tuple[socket.socket, str]] = {}
    won: set[str] = set()
    poller = select.poll()
    for host, port in targets:
        sock = socket_in(pid)
        sock.setblocking(False)
        err = sock.connect_ex((host, port))
        if err in (0, errno.EINPROGRESS):
            pending[sock.fileno()] = (sock, host)
            poller.register(sock, select.POLLOUT)
        else:
            sock.close()
    deadline = time.monotonic() + timeout
    while pending and (left := deadline - time.monotonic()) > 0:
        for fd, _ in poller.poll(left * 1000):
            sock, host = pending.pop(fd)
            poller.unregister(fd)
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                won.add(host)
            sock.close()
    for sock, _ in pending.values():
        sock.close()
    return won


def host_addresses() -> list[str]:
    links = json.loads(sh("ip", "-j", "-4", "addr", "show"))
    return [a["local"] for link in links for a in link.get("addr_info", []) if not a["local"].startswith("127.")]


def wire_world(pid: int) -> None:
    """Connect the namespace of pid to the host as the stand-in world, with /32 routes to its addresses."""
    own = [WORLD, *PRIVATE]
    sh("ip", "-batch", "-", stdin="\n".join([
        f"link add {OUTSIDE} type veth peer name eth0 netns {pid}", f"addr add {WORLD_HOST}/32 dev {OUTSIDE}",
        f"link set {OUTSIDE} up", *[f"route add {a}/32 dev {OUTSIDE}" for a in own]]) + "\n")
    sh("nsenter", "-t", str(pid), "-n", "ip", "-batch", "-", stdin="\n".join([
        *[f"addr add {a}/32 dev eth0" for a in own], "link set eth0 up", "link set lo up",
        f"route add {WORLD_HOST}/32 dev eth0", f"route add default via {WORLD_HOST} dev eth0"]) + "\n")


@dataclass
class Env:
    net: SandboxNetwork
    world: int                                        # pid in the stand-in world's namespace
    procs: list[subprocess.Popen] = field(default_factory=list)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("nsenter") is None:
        pytest.skip("needs root, unshare and nsenter")
    net = SandboxNetwork(tmp_path_factory.mktemp("state"), bridge=BRIDGE, subnet=SUBNET)
    if not net.available:
        pytest.skip(net.why)
    procs: list[subprocess.Popen] = []
    try:
        net.setup()
        world = spawn_netns(procs)
        wire_world(world)
        yield Env(net, world, procs)
    finally:
        kill(procs)
        subprocess.run(["ip", "link", "del", OUTSIDE], capture_output=True)    # takes its routes along
        subprocess.run(["nft", "delete", "table", "ip", DNAT_TABLE], capture_output=True)
        net.teardown()


@pytest.fixture
def sandbox(env: Env) -> Iterator:
    """make(sandbox_id) -> (pid, ip): a fresh namespace attached to the bridge; detached and killed afterwards."""
    procs: list[subprocess.Popen] = []
    ids: list[str] = []

    def make(sandbox_id: str) -> tuple[int, str]:
        pid = spawn_netns(procs)
        ids.append(sandbox_id)
        return pid, env.net.attach(sandbox_id, pid)

    yield make
    for sandbox_id in ids:
        env.net.detach(sandbox_id)
    kill(procs)


# ---------------------------------------------------------------- tests
def test_attach_gives_eth0_a_default_route_and_no_ipv6(env: Env, sandbox) -> None:
    pid, ip = sandbox("t-attach")
    info = json.loads(inside(pid, "ip -j -4 addr show dev eth0"))[0]
    assert [(a["local"], a["prefixlen"]) for a in info["addr_info"]] == [(ip, 16)] and "UP" in info["flags"]
    route = json.loads(inside(pid, "ip -j route show default"))
    assert [(r["gateway"], r["dev"]) for r in route] == [(GATEWAY, "eth0")]
    assert "UP" in json.loads(inside(pid, "ip -j link show dev lo"))[0]["flags"]
    assert inside(pid, "ip -o -6 addr show") == "" and inside(pid, "ip -6 route show") == ""
    seen: list[str] = []
    in_netns(pid, lambda: seen.append(Path("/proc/sys/net/ipv6/conf/all/disable_ipv6").read_text().strip()))
    assert seen == ["1"]
    port = Path(f"/sys/class/net/{veth_name('t-attach')}")
    assert os.readlink(port / "master").endswith(f"/{BRIDGE}") and (port / "brport/isolated").read_text().strip() == "1"
    assert (env.net.dir / ip).read_text() == "t-attach"


def test_outbound_traffic_is_masqueraded(env: Env, sandbox) -> None:
    pid, _ = sandbox("t-out")
    world, port = listen(env.world)
    world.settimeout(1)
    assert reached(pid, [(WORLD, port)]) == {WORLD}
    _, peer = world.accept()
    assert peer[0] == WORLD_HOST            # the world sees the host's address, not the sandbox's
    world.close()


def test_no_host_address_answers_a_sandbox(env: Env, sandbox) -> None:
    pid, _ = sandbox("t-host")
    lst, port = listen(None)
    addresses = host_addresses()
    assert GATEWAY in addresses and WORLD_HOST in addresses
    targets = [(a, port) for a in addresses]
    assert reached(None, targets) == set(addresses)      # the listener answers on every host address
    assert reached(pid, targets) == set()
    lst.close()


def test_private_ranges_are_blocked(env: Env, sandbox) -> None:
    pid, _ = sandbox("t-private")
    world, port = listen(env.world)
    targets = [(a, port) for a in PRIVATE]
    assert reached(None, targets) == set(PRIVATE)         # they answer the host
    assert reached(pid, [*targets, (WORLD, port)]) == {WORLD}
    world.close()


def test_sandboxes_cannot_reach_each_other_and_nobody_reaches_a_sandbox(env: Env, sandbox) -> None:
    a, a_ip = sandbox("t-a")
    b, b_ip = sandbox("t-b")
    la, pa = listen(a)
    lb, pb = listen(b)
    assert reached(a, [(a_ip, pa)]) == {a_ip}             # the listener works
    assert reached(b, [(a_ip, pa), (GATEWAY, pa)]) == set()
    assert reached(a, [(b_ip, pb)]) == set()
    assert reached(None, [(a_ip, pa)]) == set()           # the host never talks to a sandbox
    assert reached(env.world, [(a_ip, pa)]) == set()      # nor does the world
    la.close()
    lb.close()


def test_a_port_published_on_the_host_does_not_leak(env: Env, sandbox) -> None:
    """Podman and Docker publish ports with DNAT in prerouting; the early chain drops before that."""
    pid, _ = sandbox("t-dnat")
    world, wport = listen(env.world)
    probe = socket.socket()
    probe.bind(("0.0.0.0", 0))
    dport = probe.getsockname()[1]
    probe.close()
    sh("nft", "-f", "-", stdin=f"table ip {DNAT_TABLE} {{\n chain pre {{\n"
       "  type nat hook prerouting priority dstnat; policy accept;\n"
       f"  fib daddr type local tcp dport {dport} dnat to {WORLD}:{wport}\n }}\n}}\n")
    try:
        sh("nft", "flush", "chain", "inet", env.net.table, "early")
        assert reached(pid, [(GATEWAY, dport)]) == {GATEWAY}     # the hole the early chain closes
        env.net.setup()
        assert reached(pid, [(a, dport) for a in host_addresses()]) == set()
    finally:
        env.net.setup()
        sh("nft", "delete", "table", "ip", DNAT_TABLE)
        world.close()


def test_detach_removes_the_veth_and_frees_the_address(env: Env, sandbox) -> None:
    pid, ip = sandbox("t-detach")
    env.net.detach("t-detach")
    assert not os.path.exists(f"/sys/class/net/{veth_name('t-detach')}")
    assert not (env.net.dir / ip).exists()
    assert "eth0" not in inside(pid, "ip -o link show")
    env.net.detach("t-detach")                            # again: fine
    env.net.detach("never-attached")


def test_attach_to_a_dead_process_leaves_nothing(env: Env) -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    with pytest.raises(BackendError):
        env.net.attach("t-dead", proc.pid)
    assert not os.path.exists(f"/sys/class/net/{veth_name('t-dead')}")
    assert "t-dead" not in env.net._allocations().values()


def test_leaks_and_cleanup(env: Env) -> None:
    procs: list[subprocess.Popen] = []
    try:
        ip = env.net.attach("t-ghost", spawn_netns(procs))
        (env.net.dir / "10.232.250.250").write_text("t-stray")
        found = env.net.leaks({"someone-else"})
        assert any(veth_name("t-ghost") in d and "t-ghost" in d for d in found)
        assert any(ip in d and "t-ghost" in d for d in found)
        assert any("10.232.250.250" in d and "t-stray" in d for d in found)
        assert env.net.leaks({"t-ghost", "t-stray"}) == []
        assert sorted(env.net.cleanup({"someone-else"})) == sorted(found)
        assert env.net.leaks(set()) == []
        assert not os.path.exists(f"/sys/class/net/{veth_name('t-ghost')}") and not (env.net.dir / ip).exists()
    finally:
        kill(procs)


def test_setup_twice_keeps_one_table_one_address_and_working_sandboxes(env: Env, sandbox) -> None:
    pid, _ = sandbox("t-twice")
    env.net.setup()
    env.net.setup()
    tables = [t["table"] for t in json.loads(sh("nft", "-j", "list", "tables"))["nftables"] if "table" in t]
    assert [(t["family"], t["name"]) for t in tables].count(("inet", BRIDGE)) == 1
    info = json.loads(sh("ip", "-j", "-4", "addr", "show", "dev", BRIDGE))[0]["addr_info"]
    assert [(a["local"], a["prefixlen"]) for a in info] == [(GATEWAY, 16)]
    world, port = listen(env.world)
    assert reached(pid, [(WORLD, port)]) == {WORLD}
    world.close()


# ---------------------------------------------------------------- no namespaces needed
def test_allocation_is_exclusive_even_with_a_stale_listing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = SandboxNetwork(tmp_path, BRIDGE, SUBNET), SandboxNetwork(tmp_path, BRIDGE, SUBNET)
    assert first._allocate("x") == "10.232.0.2"
    monkeypatch.setattr(local_net, "_listdir", lambda path: [])      # only the exclusive create guards now
    assert second._allocate("y") == "10.232.0.3"
    assert (tmp_path / "net" / "10.232.0.2").read_text() == "x"


def test_concurrent_allocations_never_collide(tmp_path: Path) -> None:
    nets = [SandboxNetwork(tmp_path, BRIDGE, SUBNET) for _ in range(4)]
    got: list[str] = []
    threads = [threading.Thread(target=lambda i=i: got.append(nets[i % 4]._allocate(f"s{i}"))) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 64 and len(set(got)) == 64
    assert sorted(os.listdir(tmp_path / "net")) == sorted(got)


def test_addresses_go_round_the_subnet(tmp_path: Path) -> None:
    net = SandboxNetwork(tmp_path, BRIDGE, "10.232.0.0/29")           # .2 to .6
    assert [net._allocate(f"s{i}") for i in range(3)] == ["10.232.0.2", "10.232.0.3", "10.232.0.4"]
    (tmp_path / "net" / "10.232.0.2").unlink()
    assert [net._allocate(f"t{i}") for i in range(3)] == ["10.232.0.5", "10.232.0.6", "10.232.0.2"]
    with pytest.raises(BackendError, match="no free address"):
        net._allocate("full")


def test_unavailable_says_why(tmp_path: Path) -> None:
    net = SandboxNetwork(tmp_path, bridge="a-very-long-bridge-name")
    assert not net.available and "15 characters" in net.why
    with pytest.raises(BackendError, match="unavailable"):
        net.setup()


def test_ruleset_names_the_bridge_and_blocks_the_metadata_range(tmp_path: Path) -> None:
    rules = SandboxNetwork(tmp_path, BRIDGE, SUBNET).ruleset()
    assert f"table inet {BRIDGE} {{" in rules and f'iifname "{BRIDGE}" drop' in rules
    assert "169.254.0.0/16" in rules and "ip saddr 10.232.0.0/16 oifname" in rules
