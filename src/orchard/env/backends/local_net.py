"""Outbound-only IPv4 networking of local sandboxes: one host bridge, a veth per sandbox, nftables NAT and isolation."""

from __future__ import annotations

import ctypes
import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Callable

from orchard.errors import BackendError

CLONE_NEWNET = 0x40000000
CAP_NET_ADMIN = 12
# Never reachable from a sandbox: "this" network, private, shared (CGNAT), loopback, link-local
# (169.254.169.254, the cloud metadata endpoint), multicast and reserved. The host's own
# addresses are dropped separately (fib daddr type local), whatever range they are in.
BLOCKED = ("0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
           "172.16.0.0/12", "192.168.0.0/16", "224.0.0.0/3")

# The whole policy. {table} is derived from the bridge name, so a test bridge never clobbers a
# service's table. Loaded in one `nft -f -` transaction: the first two lines make sure the table
# exists and then delete it, so the replacement is atomic and setup() can run any number of times.
RULESET = """\
table inet {table}
delete table inet {table}
table inet {table} {{
    set blocked {{
        type ipv4_addr; flags interval
        elements = {{ {blocked} }}
    }}

    # Runs before any DNAT (priority raw = -300), so a port published on a host address by
    # Podman or Docker cannot turn a packet for the host into a forwarded one. Matching the subnet
    # too covers a kernel that reports the bridge port rather than the bridge (br_netfilter).
    chain early {{
        type filter hook prerouting priority raw; policy accept;
        iifname "lo" accept                  # the host talking to itself, on the gateway address too
        iifname "{bridge}" jump from_sandbox
        ip saddr {subnet} jump from_sandbox
    }}

    chain from_sandbox {{
        meta nfproto ipv6 drop                                 # IPv4 only
        ip saddr != {subnet} drop                              # no spoofed sources
        fib daddr type {{ local, broadcast, multicast }} drop  # any address of this host, the gateway included
        ip daddr @blocked drop                                 # private ranges: other sandboxes, LANs, metadata
    }}

    # Belt and braces: nothing from the bridge is ever delivered to the host itself.
    chain input {{
        type filter hook input priority filter; policy accept;
        iifname "{bridge}" drop
        iifname != "lo" ip saddr {subnet} drop
    }}

    chain forward {{
        type filter hook forward priority filter; policy accept;
        iifname "{bridge}" ip daddr @blocked drop                 # again after any DNAT
        iifname "{bridge}" oifname "{bridge}" drop                # sandbox to sandbox through the gateway
        iifname "{bridge}" accept                                 # out to the world
        oifname "{bridge}" ct state established,related accept    # and the replies back
        oifname "{bridge}" drop                                   # nobody outside opens a connection to a sandbox
    }}

    # Sandboxes leave with the address of whichever interface takes them out.
    chain postrouting {{
        type nat hook postrouting priority srcnat; policy accept;
        ip saddr {subnet} oifname != "{bridge}" masquerade
    }}
}}
"""

_libc = ctypes.CDLL(None, use_errno=True)


class SandboxNetwork:
    """Gives each sandbox's network namespace an eth0 on a private bridge, NATed out, isolated from everything local."""

    def __init__(self, state_dir: Path, bridge: str = "orchard0", subnet: str = "10.231.0.0/16"):
        self.bridge = bridge
        self.table = bridge                 # one table per bridge
        self.net = ipaddress.IPv4Network(subnet)
        self.gateway = str(self.net.network_address + 1)
        if self.net.prefixlen > 29:
            raise ValueError(f"subnet {subnet} is too small")
        self.dir = Path(state_dir) / "net"
        self._cursor = 0                    # where the next address search starts
        self._owned: dict[str, str] = {}    # sandbox id -> address, for what this object attached
        self.why = _missing(bridge)
        self.available = not self.why

    # ------------------------------------------------------------ host side, once
    def setup(self) -> None:
        """Bridge with the gateway address, IP forwarding and the nftables policy; safe to repeat."""
        if not self.available:
            raise BackendError(f"sandbox networking is unavailable: {self.why}")
        self.dir.mkdir(parents=True, exist_ok=True)
        if not Path(f"/sys/class/net/{self.bridge}").exists():
            _ip([f"link add {self.bridge} type bridge"], ok_if="File exists")
        _ipv6_off(self.bridge)
        _ip([f"addr replace {self.gateway}/{self.net.prefixlen} dev {self.bridge}", f"link set {self.bridge} up"])
        _sysctl("net/ipv4/ip_forward", "1")
        _run(["nft", "-f", "-"], self.ruleset())

    def ruleset(self) -> str:
        """The nftables script setup() loads."""
        return RULESET.format(table=self.table, bridge=self.bridge, subnet=self.net, blocked=", ".join(BLOCKED))

    def teardown(self) -> None:
        """Remove the bridge and the table (tests; a service leaves them in place)."""
        _run(["nft", "delete", "table", "inet", self.table], check=False)
        _run(["ip", "link", "del", self.bridge], check=False)

    # ------------------------------------------------------------ per sandbox
    def attach(self, sandbox_id: str, pid: int) -> str:
        """Give the network namespace of pid an eth0 on the bridge; returns its address."""
        ip = self._allocate(sandbox_id)
        try:
            self._plug(sandbox_id, pid)
            in_netns(pid, lambda: self._configure_inside(ip))
        except BaseException:
            self.detach(sandbox_id)
            raise
        return ip

    def detach(self, sandbox_id: str) -> None:
        """Delete the sandbox's veth pair if still there and free its address; safe to repeat."""
        if os.path.exists(f"/sys/class/net/{veth_name(sandbox_id)}"):
            _run(["ip", "link", "del", veth_name(sandbox_id)], check=False)
        ip = self._owned.pop(sandbox_id, None)
        owned = [ip] if ip else [ip for ip, owner in self._allocations().items() if owner == sandbox_id]
        for ip in owned:
            if _read(self.dir / ip) == sandbox_id:
                _unlink(self.dir / ip)

    def _plug(self, sandbox_id: str, pid: int) -> None:
        host = veth_name(sandbox_id)
        if os.path.exists(f"/sys/class/net/{host}"):      # left over from an earlier attach of this id
            _run(["ip", "link", "del", host], check=False)
        _ip([f"link add {host} type veth peer name eth0 netns {pid}"])
        try:
            _ipv6_off(host)
            _ip([f"link set {host} alias {sandbox_id} master {self.bridge}",
                 f"link set {host} type bridge_slave isolated on",
                 f"link set {host} up"])
        except BackendError:
            _run(["ip", "link", "del", host], check=False)
            raise

    def _configure_inside(self, ip: str) -> None:
        for conf in ("all", "default", "eth0"):
            _ipv6_off(conf)
        _ip([f"addr add {ip}/{self.net.prefixlen} dev eth0", "link set eth0 up", "link set lo up",
             f"route add default via {self.gateway} dev eth0"])

    # ------------------------------------------------------------ addresses
    def _allocate(self, sandbox_id: str) -> str:
        """The next free address after the last one given, claimed by creating <state_dir>/net/<ip> exclusively.

        Going round the subnet instead of taking the lowest free address keeps a fresh sandbox from
        inheriting the conntrack entries of one that just left."""
        self.dir.mkdir(parents=True, exist_ok=True)
        taken = set(_listdir(self.dir))
        first, count = int(self.net.network_address) + 2, self.net.num_addresses - 3   # no network, gateway, broadcast
        for step in range(count):
            ip = str(ipaddress.IPv4Address(first + (self._cursor + step) % count))
            if ip not in taken and _claim(self.dir / ip, sandbox_id):
                self._cursor = (self._cursor + step + 1) % count
                self._owned[sandbox_id] = ip
                return ip
        raise BackendError(f"no free address left in {self.net}")

    def _allocations(self) -> dict[str, str]:
        """ip -> sandbox id."""
        return {ip: _read(self.dir / ip) for ip in _listdir(self.dir) if not ip.startswith(".")}

    # ------------------------------------------------------------ leaks
    def _ports(self) -> dict[str, str]:
        """Host veth name -> sandbox id (from its alias) of every port on the bridge."""
        out = _run(["ip", "-j", "link", "show", "master", self.bridge], check=False)
        try:
            links = json.loads(out or "[]")
        except ValueError:
            return {}
        return {link["ifname"]: link.get("ifalias", "") for link in links}

    def leaks(self, known_ids: set[str]) -> list[str]:
        """Bridge ports and address files of sandboxes not in known_ids, described for a human."""
        found = [f"veth {name} of sandbox {sid or '?'} on {self.bridge}"
                 for name, sid in self._ports().items() if sid not in known_ids]
        found += [f"address {ip} of sandbox {sid or '?'} in {self.dir}"
                  for ip, sid in self._allocations().items() if sid not in known_ids]
        return found

    def owners(self) -> set[str]:
        """Sandbox ids that hold a bridge port or an address."""
        ports = self._ports() if os.path.exists(f"/sys/class/net/{self.bridge}") else {}
        return {sid for sid in [*ports.values(), *self._allocations().values()] if sid}

    def cleanup(self, known_ids: set[str]) -> list[str]:
        """Remove what leaks() reports; returns the descriptions of what was removed."""
        found = self.leaks(known_ids)
        for name, sid in self._ports().items():
            if sid not in known_ids:
                _run(["ip", "link", "del", name], check=False)
        for ip, sid in self._allocations().items():
            if sid not in known_ids:
                _unlink(self.dir / ip)
                self._owned.pop(sid, None)
        return found


def veth_name(sandbox_id: str) -> str:
    """Host end of a sandbox's veth pair: 'vo' + 11 hex digits, within IFNAMSIZ (15)."""
    return "vo" + hashlib.sha256(sandbox_id.encode()).hexdigest()[:11]


def in_netns(pid: int, work: Callable[[], None]) -> None:
    """Run work in a thread that has joined the network namespace of pid (children it starts inherit it)."""
    result: dict[str, BaseException] = {}
    thread = threading.Thread(target=_netns_thread, args=(pid, work, result))
    thread.start()      # setns changes only the calling thread
    thread.join()
    if "error" in result:
        raise result["error"]


def _netns_thread(pid: int, work: Callable[[], None], result: dict[str, BaseException]) -> None:
    try:
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            target = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
        except OSError as e:
            os.close(home)
            raise BackendError(f"no network namespace for pid {pid}: {e.strerror}") from e
        try:
            _setns(target)
            try:
                work()
            finally:
                _setns(home)
        finally:
            os.close(home)
            os.close(target)
    except BaseException as e:  # handed to the caller's thread
        result["error"] = e


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise BackendError(f"setns: {os.strerror(err)}")


def _missing(bridge: str) -> str:
    """Why sandbox networking cannot work here, or '' when it can."""
    if len(bridge) > 15:
        return f"bridge name {bridge!r} is longer than 15 characters"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"the {tool!r} command is not installed (apt install iproute2 nftables)"
    if not _has_cap(CAP_NET_ADMIN):
        return "the service lacks CAP_NET_ADMIN (run it as root)"
    if not os.path.exists("/proc/sys/net/ipv4/ip_forward"):
        return "this kernel has no IPv4 forwarding"
    return ""


def _has_cap(cap: int) -> bool:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> cap & 1)
    except (OSError, ValueError):
        pass
    return False


def _ip(commands: list[str], ok_if: str = "") -> None:
    """Run ip commands in one process (`ip -batch -`)."""
    try:
        _run(["ip", "-batch", "-"], "\n".join(commands) + "\n")
    except BackendError as e:
        if not ok_if or ok_if not in e.detail:
            raise


def _run(argv: list[str], stdin: str = "", check: bool = True) -> str:
    try:
        proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BackendError(f"{argv[0]} failed: {e}") from e
    if check and proc.returncode != 0:
        raise BackendError(f"{' '.join(argv)} failed: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


def _sysctl(name: str, value: str) -> None:
    """Write /proc/sys/<name> as seen by the calling thread's network namespace."""
    try:
        with open(f"/proc/sys/{name}", "w") as f:
            f.write(value)
    except OSError as e:
        raise BackendError(f"cannot set {name.replace('/', '.')}={value}: {e.strerror}") from e


def _ipv6_off(conf: str) -> None:
    """Disable IPv6 on an interface ('all', 'default' or a name); nothing to do on a kernel without IPv6."""
    if os.path.isdir("/proc/sys/net/ipv6/conf"):
        _sysctl(f"net/ipv6/conf/{conf}/disable_ipv6", "1")


def _claim(path: Path, sandbox_id: str) -> bool:
    """Create path holding sandbox_id unless it exists; link(2) makes it appear whole or not at all."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        tmp.write_text(sandbox_id)
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError as e:
        raise BackendError(f"cannot record address {path.name}: {e.strerror}") from e
    finally:
        _unlink(tmp)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
