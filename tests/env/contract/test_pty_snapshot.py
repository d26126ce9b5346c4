"""The PTY WebSocket and snapshots to images."""

from __future__ import annotations

import time

from .conftest import IMAGE


def test_pty_echo_and_exit_code(sandbox):
    with sandbox.exec(["bash", "--norc", "-i"], pty=True) as proc:
        proc.write(b"stty -echo; echo $((6*7)); tty; exit 5\n")
        out = b""
        deadline = time.monotonic() + 20
        while b"42" not in out and time.monotonic() < deadline:
            out += proc.read(timeout=5)
        assert b"42" in out
        assert proc.wait(timeout=20) == 5


def test_pty_disconnect_kills_the_session(sandbox):
    proc = sandbox.exec(["sleep", "777"], pty=True)
    proc.close()
    deadline = time.monotonic() + 10
    while "sleep 777" in sandbox.exec("ps -eo args").stdout and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "sleep 777" not in sandbox.exec("ps -eo args").stdout


def test_pty_signal(sandbox):
    with sandbox.exec(["sleep", "100"], pty=True) as proc:
        proc.send_signal("TERM")
        assert proc.wait(timeout=20) == -15


def test_snapshot_then_start_from_it(client, sandbox):
    sandbox.exec("echo prepared > /workspace/state.txt && rm -f /etc/motd && mkdir -p /opt/tool")
    snap = sandbox.snapshot("contract-snap:v1")
    assert snap.image == "contract-snap:v1"
    with client.create_sandbox("contract-snap:v1") as child:
        r = child.exec("cat /workspace/state.txt; test -e /etc/motd && echo motd-back; test -d /opt/tool && echo tool")
        assert r.stdout == "prepared\ntool\n"
        child.exec("echo changed > /workspace/state.txt")
    with client.create_sandbox("contract-snap:v1") as again:
        assert again.exec("cat /workspace/state.txt").stdout == "prepared\n"


def test_snapshot_name_is_validated(http, sandbox):
    assert http.post(f"/sandboxes/{sandbox.sandbox_id}/snapshot", json={"image": "Bad Name"}).status_code == 422
    assert http.post(f"/sandboxes/{sandbox.sandbox_id}/snapshot", json={"image": "host"}).status_code == 422


def test_image_host_default(client):
    with client.create_sandbox(IMAGE) as sb:
        assert sb.exec("test -x /usr/bin/bash && echo ok").stdout == "ok\n"


def test_oci_image_from_local_podman_storage(client):
    from orchard.env.podman import ensure_busybox_image
    import pytest

    image = ensure_busybox_image()
    if image is None:
        pytest.skip("podman or busybox is not installed")
    with client.create_sandbox(image) as sb:
        r = sb.exec("pwd; echo hi > f; cat f; test -e /bin/busybox && echo busybox")
        assert r.stdout == "/work\nhi\nbusybox\n", r
