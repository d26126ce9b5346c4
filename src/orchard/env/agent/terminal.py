"""Terminal sessions of the agent: a command on a new PTY, relayed raw over the request's own connection."""

from __future__ import annotations

import errno
import fcntl
import os
import select
import signal
import socket
import struct
import termios
import threading
import uuid
from typing import Optional

from .execute import OWN, child_env, kill_group, spawn


class Session:
    """One command on a terminal; ``code`` is set when it has ended (negative -N when killed by signal N)."""

    def __init__(self, argv: list, cwd: str, env: dict, rows: int, cols: int):
        self.id = uuid.uuid4().hex
        self.master, slave = os.openpty()
        try:
            resize(self.master, rows, cols)
            self.proc = spawn(argv, cwd=cwd, env={"TERM": "xterm-256color", **child_env(env)},
                              stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                              preexec_fn=_take_terminal)
        except BaseException:
            os.close(self.master)
            raise
        finally:
            os.close(slave)
        self.code: Optional[int] = None
        self.ended = threading.Event()

    def relay(self, conn: socket.socket) -> None:
        """Copy bytes both ways until the command's terminal closes or the client goes away."""
        try:
            while True:
                ready, _, _ = select.select([conn, self.master], [], [])
                if self.master in ready and not _copy_out(self.master, conn):
                    break
                if conn in ready and not _copy_in(conn, self.master):
                    kill_group(self.proc.pid)          # the client left: nothing may outlive the session
                    break
        finally:
            self.finish()

    def finish(self) -> None:
        if self.ended.is_set():
            return
        self.code = self.proc.wait()
        OWN.discard(self.proc.pid)
        os.close(self.master)
        self.ended.set()

    def signal(self, sig: int) -> None:
        try:
            os.kill(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        kill_group(self.proc.pid)


def resize(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _take_terminal() -> None:
    """In the child, after setsid: make the PTY (its stdin) the controlling terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)


def _copy_out(master: int, conn: socket.socket) -> bool:
    try:
        data = os.read(master, 65536)
    except OSError as e:
        if e.errno == errno.EIO:        # every holder of the terminal's other end is gone
            return False
        raise
    if not data:
        return False
    try:
        conn.sendall(data)
    except OSError:
        return False
    return True


def _copy_in(conn: socket.socket, master: int) -> bool:
    try:
        data = conn.recv(65536)
    except OSError:
        return False
    if not data:
        return False
    os.write(master, data)
    return True
