"""The fake CNI: a closed pod gets a network namespace of its own, reached and let out only through relays.

A pod that an open egress policy selects (an ipBlock of 0.0.0.0/0: the backend's networked
sandboxes) shares this machine's network, as before. Every other pod runs in a network namespace
holding only loopback; the kubelet then relays this machine's 127.0.0.1:<agent port> to the agent
inside (the agent-ingress policy), and, for each egress rule allowing a loopback /32 address and
TCP port, listens on that address and port inside the pod and relays to the same address and port
here: what a cluster's CNI would let through, for the only addresses a fake on one machine has.
Other allowances (other addresses, DNS) reach nothing, as they would reach nothing real here.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import socket
import threading
from typing import Callable, Optional

from orchard.env.agent.relay import splice

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def egress_rules(policies: list[dict], labels: dict) -> list[dict]:
    """The egress rules of the policies that select a pod with these labels."""
    rules: list[dict] = []
    for policy in policies:
        spec = policy.get("spec") or {}
        if "Egress" in (spec.get("policyTypes") or []) and _matches(spec.get("podSelector") or {}, labels):
            rules += spec.get("egress") or []
    return rules


def is_open(rules: list[dict]) -> bool:
    """Does a rule let the pod out anywhere (the host network stands in for that)?"""
    peers = [peer for rule in rules for peer in rule.get("to") or []]
    return any((peer.get("ipBlock") or {}).get("cidr") == "0.0.0.0/0" for peer in peers)


def loopback_allowances(rules: list[dict]) -> list[tuple[str, int]]:
    """(address, port) for each loopback /32 and TCP port the rules allow."""
    allowed = []
    for rule in rules:
        ports = [p["port"] for p in rule.get("ports") or [] if p.get("protocol", "TCP") == "TCP"]
        for peer in rule.get("to") or []:
            cidr = (peer.get("ipBlock") or {}).get("cidr", "")
            if cidr.endswith("/32") and ipaddress.ip_address(cidr[:-3]).is_loopback:
                allowed += [(cidr[:-3], port) for port in ports]
    return allowed


class PodNetwork:
    """The network namespace of one pod (that of ``pid``) and the relays into and out of it."""

    def __init__(self, pid: int, agent_port: int, allowances: list[tuple[str, int]]):
        self.netns = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
        self.agent_port = agent_port
        self.listeners: list[socket.socket] = []
        self._listen(socket.create_server(("127.0.0.1", agent_port)), self.agent_connection)
        for address, port in allowances:
            inside = self.socket()
            inside.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            inside.bind((address, port))
            inside.listen(64)
            self._listen(inside, lambda a=address, p=port: socket.create_connection((a, p), 10))

    def socket(self) -> socket.socket:
        """A TCP socket of the pod's namespace (a socket stays in the namespace it was made in)."""
        made: dict = {}
        thread = threading.Thread(target=self._make_socket, args=(made,))
        thread.start()           # a thread of its own: setns changes only the calling thread
        thread.join()
        if "error" in made:
            raise made["error"]
        return made["sock"]

    def _make_socket(self, made: dict) -> None:
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            _setns(self.netns)
            try:
                made["sock"] = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            finally:
                _setns(home)
        except OSError as e:
            made["error"] = e
        finally:
            os.close(home)

    def agent_connection(self) -> socket.socket:
        sock = self.socket()
        try:
            sock.settimeout(10)
            sock.connect(("127.0.0.1", self.agent_port))
        except OSError:
            sock.close()
            raise
        sock.settimeout(None)
        return sock

    def _listen(self, listener: socket.socket, connect: Callable[[], socket.socket]) -> None:
        self.listeners.append(listener)
        threading.Thread(target=_accept_loop, args=(listener, connect), daemon=True).start()

    def close(self) -> None:
        for listener in self.listeners:
            listener.close()
        os.close(self.netns)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def _accept_loop(listener: socket.socket, connect: Callable[[], socket.socket]) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_relay, args=(client, connect), daemon=True).start()


def _relay(client: socket.socket, connect: Callable[[], socket.socket]) -> None:
    try:
        upstream: Optional[socket.socket] = connect()
    except OSError:
        upstream = None
    if upstream is None:
        client.close()
        return
    for sock in (client, upstream):        # no Nagle: a relayed reply must not wait for a delayed ACK
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    splice(client, upstream)
