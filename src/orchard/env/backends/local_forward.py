"""Model-endpoint forwarding: a listening socket inside a sandbox's network namespace, relayed to one host endpoint."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import socket
import threading

from orchard import errors

log = logging.getLogger("orchard.env")
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def listen_in_netns(pid: int, port: int) -> socket.socket:
    """Open 127.0.0.1:port inside the network namespace of pid; the socket stays there after we leave."""
    result: dict = {}
    thread = threading.Thread(target=_listen_thread, args=(pid, port, result))
    thread.start()      # a thread of its own: setns changes only the calling thread
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["sock"]


def _listen_thread(pid: int, port: int, result: dict) -> None:
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    try:
        _setns(target)
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
            sock.listen(128)
            sock.setblocking(False)
            result["sock"] = sock
        finally:
            _setns(home)
    except OSError as e:
        result["error"] = e
    finally:
        os.close(home)
        os.close(target)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


async def open_forwarder(pid: int, port: int, host: str, host_port: int) -> "Forwarder":
    """Listen on `port` inside the network namespace of `pid` and relay to (host, host_port)."""
    try:
        sock = await asyncio.to_thread(listen_in_netns, pid, port)
    except OSError as e:
        raise errors.SandboxFailedError(f"Cannot open model endpoint port {port} in the sandbox: {e}") from e
    forwarder = Forwarder(sock, host, host_port)
    await forwarder.start()
    return forwarder


class Forwarder:
    """Relays every connection accepted on a sandbox-side socket to (host, port)."""

    def __init__(self, sock: socket.socket, host: str, port: int):
        self.sock, self.host, self.port = sock, host, port
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, sock=self.sock)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError as e:
            log.warning("model endpoint %s:%d unreachable: %s", self.host, self.port, e)
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer), return_exceptions=True)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()
