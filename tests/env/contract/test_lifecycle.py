"""Server-side lifecycle: TTL expiry deletes a sandbox and everything it held."""

from __future__ import annotations

import time

from .conftest import IMAGE


def test_ttl_expiry_deletes(http):
    sid = http.post("/sandboxes", json={"image": IMAGE, "ttl_seconds": 1}).json()["sandbox_id"]
    assert http.get(f"/sandboxes/{sid}/wait", params={"timeout": 30}).json()["status"] == "ready"
    deadline = time.monotonic() + 20
    while http.get(f"/sandboxes/{sid}").status_code == 200 and time.monotonic() < deadline:
        time.sleep(0.25)
    assert http.get(f"/sandboxes/{sid}").status_code == 404
    assert http.post(f"/sandboxes/{sid}/exec", json={"command": "true"}).status_code == 404


def test_heartbeat_extends_ttl(http):
    sid = http.post("/sandboxes", json={"image": IMAGE, "ttl_seconds": 3}).json()["sandbox_id"]
    before = http.get(f"/sandboxes/{sid}/wait", params={"timeout": 30}).json()["expires_at"]
    after = http.post(f"/sandboxes/{sid}/heartbeat").json()["expires_at"]
    assert after > before
    http.delete(f"/sandboxes/{sid}")
