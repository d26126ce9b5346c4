"""The model-endpoint relay: 127.0.0.1:P inside the pod, each connection piped to one fixed target (stdlib only).

The backend names the relay in the sandbox container's environment as ``P=ADDR:PORT[,ADDR:PORT...]``
(``RELAY_ENV``): addresses the service resolved at create time, which the sandbox's egress
NetworkPolicy allows and nothing else. A pod of a closed sandbox has no DNS, so the relay never
resolves a name; it tries the addresses in order and closes the client's connection when none answers.
"""

from __future__ import annotations

import socket
import threading
from typing import Optional

CONNECT_TIMEOUT = 10.0
CHUNK = 65536


def parse(value: str) -> tuple[int, list[tuple[str, int]]]:
    """``"8000=10.0.0.7:8300,[fd00::7]:8300"`` -> (8000, [("10.0.0.7", 8300), ("fd00::7", 8300)])."""
    port, sep, rest = value.partition("=")
    if not sep or not rest:
        raise ValueError(f"relay {value!r} is not PORT=ADDR:PORT[,ADDR:PORT...]")
    targets = []
    for item in rest.split(","):
        host, sep, target_port = item.rpartition(":")
        if not sep or not host:
            raise ValueError(f"relay target {item!r} is not ADDR:PORT")
        targets.append((host.strip("[]"), _port(target_port)))
    return _port(port), targets


def _port(text: str) -> int:
    port = int(text)
    if not 1 <= port <= 65535:
        raise ValueError(f"port {port} is out of range")
    return port


def format_relay(port: int, targets: list[tuple[str, int]]) -> str:
    """The inverse of parse (what the backend writes into the pod spec)."""
    return f"{port}=" + ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in targets)


class Relay:
    """Accepts on 127.0.0.1:port and pipes each connection to the first target that answers."""

    def __init__(self, port: int, targets: list[tuple[str, int]]):
        self.targets = targets
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]

    def start(self) -> "Relay":
        threading.Thread(target=self._accept_loop, name="orchard-relay", daemon=True).start()
        return self

    def close(self) -> None:
        self.sock.close()

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return          # closed
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = self._connect()
        if upstream is None:
            client.close()
            return
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)     # no Nagle: replies must not wait for ACKs
        splice(client, upstream)

    def _connect(self) -> Optional[socket.socket]:
        for host, port in self.targets:
            try:
                conn = socket.create_connection((host, port), CONNECT_TIMEOUT)
            except OSError:
                continue
            conn.settimeout(None)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return conn
        return None


def splice(client: socket.socket, upstream: socket.socket) -> None:
    """Copy both ways until both ends have finished, then close both sockets."""
    back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
    back.start()
    _pipe(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    """Copy until source ends, then pass the end on (half-close) so replies still flow the other way."""
    try:
        while data := source.recv(CHUNK):
            sink.sendall(data)
    except OSError:
        pass
    try:
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def start(value: Optional[str]) -> Optional[Relay]:
    """The relay the environment names, listening (None when none is named)."""
    if not value:
        return None
    port, targets = parse(value)
    return Relay(port, targets).start()
