"""The agent's model-endpoint relay on its own: parsing its setting, piping both ways, failing over, failing clearly."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

import pytest

from orchard.env import agent
from orchard.env.agent import relay


def echo_server() -> tuple[socket.socket, int]:
    """A TCP server that answers each connection with b'echo:' + everything it got, once the client half-closes."""
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                data = b""
                while chunk := conn.recv(65536):
                    data += chunk
                conn.sendall(b"echo:" + data)

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ask(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), 10) as conn:
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
        return reply


def test_parse_and_format_are_inverse():
    value = relay.format_relay(8000, [("10.0.0.7", 8300), ("fd00::7", 8300)])
    assert value == "8000=10.0.0.7:8300,[fd00::7]:8300"
    assert relay.parse(value) == (8000, [("10.0.0.7", 8300), ("fd00::7", 8300)])


@pytest.mark.parametrize("bad", ["8000", "8000=", "x=1.2.3.4:5", "8000=1.2.3.4", "8000=1.2.3.4:0", "70000=1.2.3.4:5",
                                 "8000=:5"])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        relay.parse(bad)


def test_relays_both_ways_and_fails_over_to_the_next_address():
    srv, port = echo_server()
    r = relay.Relay(0, [("127.0.0.1", closed_port()), ("127.0.0.1", port)]).start()
    try:
        big = os.urandom(3 << 20)
        assert ask(r.port, big) == b"echo:" + big
        assert ask(r.port, b"hi") == b"echo:hi"
    finally:
        r.close()
        srv.close()


def test_an_unreachable_target_closes_the_client():
    r = relay.Relay(0, [("127.0.0.1", closed_port())]).start()
    try:
        with socket.create_connection(("127.0.0.1", r.port), 10) as conn:
            conn.settimeout(30)
            assert conn.recv(1) == b"", "the relay closes a connection it cannot pass on"
    finally:
        r.close()


def test_no_setting_no_relay():
    assert relay.start(None) is None and relay.start("") is None


def test_the_agent_refuses_a_bad_relay_setting_at_start(tmp_path):
    """A pod whose relay cannot start fails with the reason instead of serving without its model endpoint."""
    taken = socket.create_server(("127.0.0.1", 0))
    env = {**os.environ, agent.TOKEN_ENV: "t", agent.TOKEN_FILE_ENV: str(tmp_path / "none"), agent.PORT_ENV: "0",
           agent.RELAY_ENV: f"{taken.getsockname()[1]}=127.0.0.1:9"}
    code = "import sys; from orchard.env.agent import server; server.main()"
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    taken.close()
    assert done.returncode != 0 and "model endpoint relay" in done.stderr
