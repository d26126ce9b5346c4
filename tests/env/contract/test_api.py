"""Routes, status codes, auth and ownership, as the REST contract states them."""

from __future__ import annotations

import httpx
import pytest

from orchard import ForbiddenError, NotFoundError, SandboxClient, SandboxFailedError

from .conftest import ADMIN, IMAGE, KEY_B


def test_root_and_health_need_no_key(url):
    root = httpx.get(url + "/").json()
    assert root["status"] == "running" and root["version"]
    assert httpx.get(url + "/health").json() == {"status": "healthy"}
    assert httpx.get(url + "/openapi.json").json()["paths"]["/sandboxes/{sandbox_id}/exec"]


def test_missing_and_wrong_key(url):
    r = httpx.get(url + "/sandboxes")
    assert r.status_code == 401
    assert r.json()["detail"] == "Missing API key. Please provide X-API-Key header."
    r = httpx.get(url + "/sandboxes", headers={"X-API-Key": "nope"})
    assert r.status_code == 403 and r.json()["detail"] == "Invalid API key"


def test_request_id_is_echoed(http):
    assert http.get("/health", headers={"X-Request-ID": "abc-1"}).headers["x-request-id"] == "abc-1"
    assert http.get("/health").headers["x-request-id"]


def test_create_info_list_delete(client, http):
    sb = client.create_sandbox(IMAGE, cpu="500m", memory="256Mi")
    info = http.get(f"/sandboxes/{sb.sandbox_id}").json()
    assert info["status"] == "ready" and info["ready"] is True
    assert info["cpu"] == "500m" and info["memory"] == "256Mi" and info["block_network"] is True
    for key in ("namespace", "image", "pod_name", "created_at", "status_message"):
        assert key in info
    listed = http.get("/sandboxes").json()["sandboxes"]
    assert sb.sandbox_id in {s["sandbox_id"] for s in listed}
    r = http.delete(f"/sandboxes/{sb.sandbox_id}")
    assert r.status_code == 200 and r.json() == {"status": "deleted", "sandbox_id": sb.sandbox_id}
    assert http.delete(f"/sandboxes/{sb.sandbox_id}").status_code == 200      # idempotent
    assert http.delete("/sandboxes/never-existed").json()["status"] == "deleted"
    assert http.get(f"/sandboxes/{sb.sandbox_id}").status_code == 404


def test_create_reply_shape(http):
    r = http.post("/sandboxes", json={"image": IMAGE, "sandbox_id": "shape-check"})
    body = r.json()
    assert r.status_code == 200, body
    assert set(body) >= {"sandbox_id", "namespace", "image", "block_network", "cpu", "memory", "timeout", "status"}
    assert body["status"] in ("pending", "ready") and body["sandbox_id"] == "shape-check"
    assert http.get("/sandboxes/shape-check/wait", params={"timeout": 30}).json()["status"] == "ready"
    http.delete("/sandboxes/shape-check")


def test_duplicate_and_malformed_ids(http):
    assert http.post("/sandboxes", json={"image": IMAGE, "sandbox_id": "dup-1"}).status_code == 200
    r = http.post("/sandboxes", json={"image": IMAGE, "sandbox_id": "dup-1"})
    assert r.status_code == 409 and "already exists" in r.json()["detail"]
    for bad in ("Upper", "-lead", "trail-", "a" * 64, "has_underscore", ""):
        assert http.post("/sandboxes", json={"image": IMAGE, "sandbox_id": bad}).status_code == 422, bad
    http.delete("/sandboxes/dup-1")


def test_bad_quantities_are_422(http):
    assert http.post("/sandboxes", json={"image": IMAGE, "cpu": "lots"}).status_code == 422
    assert http.post("/sandboxes", json={"image": IMAGE, "memory": "-1Gi"}).status_code == 422
    assert http.post("/sandboxes", json={"image": IMAGE, "timeout": 0}).status_code == 422
    assert http.post("/sandboxes", json={"image": IMAGE, "memory": "99999999999Ti"}).status_code == 422
    assert http.post("/sandboxes", json={"image": IMAGE, "cpu": "100000"}).status_code == 422


def test_unknown_image_fails_with_reason(client, http):
    with pytest.raises(SandboxFailedError) as err:
        client.create_sandbox("no-such-image:1", timeout=30)
    assert "Available" in err.value.detail and "host" in err.value.detail
    r = http.post("/sandboxes", json={"image": "/nonexistent/rootfs"})
    info = http.get(f"/sandboxes/{r.json()['sandbox_id']}/wait", params={"timeout": 30}).json()
    assert info["status"] == "failed" and info["status_message"]


def test_wait_and_heartbeat_unknown_are_404(http):
    assert http.get("/sandboxes/nope/wait", params={"timeout": 1}).status_code == 404
    assert http.post("/sandboxes/nope/heartbeat").status_code == 404
    assert http.post("/sandboxes/nope/exec", json={"command": "true"}).status_code == 404
    assert http.get("/jobs/nope").status_code == 404
    assert http.get("/jobs/nope/wait").status_code == 404


def test_heartbeat(sandbox, http):
    r = http.post(f"/sandboxes/{sandbox.sandbox_id}/heartbeat")
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["sandbox_id"] == sandbox.sandbox_id


def test_another_keys_sandbox_is_invisible(url, sandbox):
    with SandboxClient(base_url=url, api_key=KEY_B) as other:
        with pytest.raises(NotFoundError):
            other.get_sandbox(sandbox.sandbox_id).info()
        assert sandbox.sandbox_id not in {s.sandbox_id for s in other.list_sandboxes()}
        with pytest.raises(NotFoundError):
            other.get_sandbox(sandbox.sandbox_id).exec("true")
        other.delete_sandbox(sandbox.sandbox_id)          # a no-op for a sandbox it does not own
    assert sandbox.exec("true").exit_code == 0
    with SandboxClient(base_url=url, api_key=ADMIN) as admin:
        assert sandbox.sandbox_id in {s.sandbox_id for s in admin.list_sandboxes()}
        assert admin.resources().sandboxes is not None


def test_wrong_key_raises_forbidden(url):
    with SandboxClient(base_url=url, api_key="wrong") as c, pytest.raises(ForbiddenError):
        c.list_sandboxes()


def test_resources_and_metrics(sandbox, http):
    res = http.get("/resources").json()
    assert res["status"] == "ok" and res["sandbox_count"] >= 1
    assert res["total_capacity"]["cpu"] > 0 and res["total_capacity"]["memory_bytes"] > 0
    assert res.get("sandboxes") is None                      # not an admin key
    metrics = http.get("/metrics")
    assert metrics.status_code == 200 and "orchard_sandboxes_created" in metrics.text


def test_oversized_body_is_413(http, sandbox):
    big = "A" * (17 * 2**20)
    r = http.post(f"/sandboxes/{sandbox.sandbox_id}/files", content=b'{"path": "x", "content": "' + big.encode() + b'"}',
                  headers={"Content-Type": "application/json"})
    assert r.status_code == 413


def test_errors_never_leak_tracebacks(http):
    r = http.post("/sandboxes", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and "Traceback" not in r.text
