"""Through the API: malformed JSON, wrong types, unknown fields and invalid ids: 4xx, never a 500."""

from __future__ import annotations

import http.client
import json
from typing import Optional

import httpx
import pytest

from orchard import NotFoundError, SandboxClient

from .conftest import IMAGE, KEY_A, KEY_B, b64

JUNK_BODIES = [b"{bad", b"", b"null", b"[]", b'"text"', b"[" * 50000 + b"]" * 50000,
               b'{"a": ' * 5000 + b"1" + b"}" * 5000, b'{"command": "x", "command": 1}',
               b"1" * 100000]
# bodies whose 422 reply would echo an input JSON cannot carry: non-finite numbers, undecodable bytes
UNENCODABLE = [(b"1e999", "application/json"), (b"NaN", "application/json"), (b"-Infinity", "application/json"),
               (b'{"image": NaN}', "application/json"), (b'{"command": "true", "timeout_seconds": Infinity}', "application/json"),
               (b'{"path": "/x", "content": "", "mode": 1e999}', "application/json"),
               (b'{"patch": "x", "timeout_seconds": NaN}', "application/json"),
               (b"\xff\xfe\x00garbage", "text/plain"), (b"\xff\xfe\x00garbage", "application/octet-stream"),
               (b'{"\\ud800": "lone surrogate"}', "application/json"), (b'{"image": 1, "x": "\\udfff"}', "application/json")]


def _body_routes(sid: str) -> dict[str, list[dict]]:
    """Each body route and request bodies of the wrong shape for it."""
    return {
        "/sandboxes": [{"image": 5}, {"image": None}, {}, {"image": "host", "block_network": "maybe"},
                       {"image": "host", "cpu": 2}, {"image": "host", "memory": ["1Gi"]}, {"image": "host", "timeout": "x"},
                       {"image": "host", "timeout": -5}, {"image": "host", "sandbox_id": 7},
                       {"image": "host", "model_endpoint": "127.0.0.1:1"}, {"image": "host", "model_endpoint": {"port": 0}},
                       {"image": "host", "ttl_seconds": 0}, {"image": "host", "disk": {"size": 1}},
                       {"image": ["host"]}, {"image": "host", "cpu": "-1"}, {"image": "host", "memory": "0x10"}],
        f"/sandboxes/{sid}/exec": [{"command": 5}, {"command": None}, {}, {"command": [1, 2]}, {"command": {"a": 1}},
                                   {"command": "true", "timeout_seconds": 0}, {"command": "true", "timeout_seconds": "x"},
                                   {"command": "true", "timeout_seconds": -1}, {"command": "true", "env": {"A": 1}},
                                   {"command": "true", "env": ["A=1"]}, {"command": "true", "env": {"A=B": "x"}},
                                   {"command": "true", "env": {"": "x"}}, {"command": "true", "cwd": 5},
                                   {"command": "true", "wait": "perhaps"}, {"command": "true", "login_shell": [1]},
                                   {"command": []}, {"command": ["a\x00b"]}, {"command": "a\x00b"},
                                   {"command": "true", "timeout_seconds": 1.5}],
        f"/sandboxes/{sid}/files": [{"path": 5, "content": ""}, {"path": "/x"}, {"content": b64("x")},
                                    {"path": "/x", "content": 5}, {"path": "/x", "content": b64("x"), "mode": "rwx"},
                                    {"path": "/x", "content": b64("x"), "mode": -1}, {"path": "/x", "content": b64("x"), "mode": 2**40},
                                    {"path": "/x", "content": "!!!"}, {"path": "/x", "content": "QQ="},
                                    {"path": ["/x"], "content": ""}],
        f"/sandboxes/{sid}/apply_patch": [{"patch": 5}, {}, {"patch": "x", "timeout_seconds": 0},
                                          {"patch": "x", "timeout_seconds": "long"}, {"patch": "x", "cwd": 7},
                                          {"patch": ["x"]}],
        f"/sandboxes/{sid}/snapshot": [{"image": 5}, {}, {"image": "Bad Name"}, {"image": "../../etc"},
                                       {"image": "/abs"}, {"image": "a" * 5000}, {"image": "host"}, {"image": "x\x00y"},
                                       {"image": "ok:" + ":" * 10}],
    }


def test_malformed_and_mistyped_bodies_are_4xx(sandbox, http, service_ok):
    """Malformed JSON, wrong types and unknown fields on every route: 4xx, never a 500, and unknown fields grant nothing."""
    sid = sandbox.sandbox_id
    routes = _body_routes(sid)
    for route, bodies in routes.items():
        for raw in JUNK_BODIES:
            for ctype in ("application/json", "text/plain"):
                r = http.post(route, content=raw, headers={"Content-Type": ctype})
                assert 400 <= r.status_code < 500 and "Traceback" not in r.text, (route, raw[:30], ctype, r.status_code, r.text[:200])
        for body in bodies:
            r = http.post(route, json=body)
            assert 400 <= r.status_code < 500 and "Traceback" not in r.text, (route, body, r.status_code, r.text[:300])
    # GET parameters of the wrong type
    for path, params in ((f"/sandboxes/{sid}/wait", {"timeout": "soon"}), (f"/sandboxes/{sid}/wait", {"timeout": "nan"}),
                         (f"/sandboxes/{sid}/wait", {"timeout": "-1"}), (f"/sandboxes/{sid}/wait", {"timeout": "1e400"}),
                         ("/jobs/x/wait", {"timeout": "inf"}), ("/sandboxes", {"status": "x" * 10000})):
        r = http.get(path, params=params)
        assert r.status_code in (200, 404, 422), (path, params, r.status_code)
    assert sandbox.exec("echo intact").stdout == "intact\n"
    service_ok()


def test_unknown_fields_grant_nothing(url, http, bystander, service_ok):
    """Fields the contract does not know (privileges, mounts, owners, another sandbox's id) are ignored."""
    body = {"image": IMAGE, "privileged": True, "cap_add": ["ALL"], "user": "root", "network_mode": "host",
            "mounts": [{"source": "/", "target": "/host", "type": "bind"}], "volumes": {"/": "/host"},
            "owner": "", "admin": True, "security_opt": ["seccomp=unconfined"], "pids": 100000, "devices": ["/dev/sda"]}
    r = http.post("/sandboxes", json=body)
    assert r.status_code == 200, r.text
    sid = r.json()["sandbox_id"]
    try:
        assert http.get(f"/sandboxes/{sid}/wait", params={"timeout": 60}).json()["status"] == "ready"
        job = http.post(f"/sandboxes/{sid}/exec", json={
            "command": "grep CapEff /proc/self/status; ls /host 2>&1; hostname; ls /dev/sda 2>&1; "
                       "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '",
            "wait": True, "privileged": True, "user": "0", "sandbox_id": bystander.sandbox_id,
            "namespace": "host", "cap_add": ["SYS_ADMIN"], "pid": "host"}).json()
        out = job["stdout"]
        assert "CapEff:\t0000000000000000" in out and "No such file" in out, out
        assert sid in out and bystander.sandbox_id not in out, out         # ran where the path says, nowhere else
        assert out.strip().endswith("\nlo"), out
        with SandboxClient(base_url=url, api_key=KEY_B) as b, pytest.raises(NotFoundError):
            b.get_sandbox(sid)                                              # still owned by key A only
        assert all(s["sandbox_id"] != sid for s in httpx.get(f"{url}/sandboxes", headers={"X-API-Key": KEY_B}).json()["sandboxes"])
    finally:
        http.delete(f"/sandboxes/{sid}")
    service_ok()


BAD_IDS = ["UPPER", "Mixed-Case", "a" * 64, "a" * 300, "a%2Fb", "a/b", "..", "%2E%2E", ".", "a%00b", "%C3%BC-ni",
           "%E2%98%83", "-lead", "trail-", "sp%20ace", "semi;colon", "a%5Cb", "%2E%2E%2F%2E%2E%2Fetc", "../..", "*",
           "%25", "'%20OR%201=1--", "$(id)", "..%2F..%2Fjobs"]


def raw_request(url: str, method: str, path: str, body: Optional[dict] = None, key: str = KEY_A) -> tuple[int, str]:
    """One request with the path sent byte for byte (no client-side normalisation of dots or escapes)."""
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"X-API-Key": key, **({"Content-Type": "application/json"} if data else {})}
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


def test_invalid_ids_on_every_route_are_404_or_422(sandbox, url, service_ok):
    """Invalid sandbox and job ids (uppercase, 64+ chars, slashes, '..', unicode) on every route: 404 or 422."""
    bodies = {"exec": {"command": "true"}, "files": {"path": "/x", "content": ""},
              "apply_patch": {"patch": "x"}, "snapshot": {"image": "attack-snap"}}
    for bad in BAD_IDS:
        routes = [("GET", f"/sandboxes/{bad}"), ("GET", f"/sandboxes/{bad}/wait?timeout=1"),
                  ("POST", f"/sandboxes/{bad}/heartbeat"), ("POST", f"/sandboxes/{bad}/exec"),
                  ("POST", f"/sandboxes/{bad}/files"), ("GET", f"/sandboxes/{bad}/files?path=/etc/hostname"),
                  ("GET", f"/sandboxes/{bad}/files/list?path=/"), ("POST", f"/sandboxes/{bad}/apply_patch"),
                  ("POST", f"/sandboxes/{bad}/snapshot"), ("GET", f"/jobs/{bad}"), ("GET", f"/jobs/{bad}/wait?timeout=1"),
                  ("DELETE", f"/sandboxes/{bad}")]
        for method, path in routes:
            body = next((v for k, v in bodies.items() if path.split("?")[0].endswith("/" + k)), None)
            status, text = raw_request(url, method, path, body if method == "POST" else None)
            # a path that no longer names a route is a 404/405; "/sandboxes/.." may even be "/" itself: harmless
            allowed = (200, 404, 405, 422) if method == "DELETE" or bad in ("..", "../..", ".") else (404, 405, 422)
            assert status in allowed and "Traceback" not in text, (method, path[:80], status, text[:200])
            if status == 200 and method == "GET":
                assert sandbox.sandbox_id not in text or path.startswith("/sandboxes/../"), (path, text[:200])
    status, _ = raw_request(url, "POST", "/sandboxes", {"image": IMAGE, "sandbox_id": "ünï"})
    assert status == 422
    assert sandbox.exec("echo intact").stdout == "intact\n"            # no delete above hit a real sandbox
    service_ok()


def test_validation_errors_with_unencodable_input_are_4xx(sandbox, http, service_ok):
    """Input JSON cannot carry back (NaN, Infinity, 1e999, lone surrogates, non-UTF-8): 422 without echoing it, never a 500."""
    sid = sandbox.sandbox_id
    try:
        for route in ("/sandboxes", f"/sandboxes/{sid}/exec", f"/sandboxes/{sid}/files", f"/sandboxes/{sid}/apply_patch"):
            for raw, ctype in UNENCODABLE:
                r = http.post(route, content=raw, headers={"Content-Type": ctype})
                assert 400 <= r.status_code < 500, (route, raw, ctype, r.status_code)
    finally:
        service_ok()


def test_nul_in_apply_patch_cwd_is_not_500(sandbox, http, service_ok):
    """A NUL byte in apply_patch's cwd: refused by validation (422)."""
    try:
        r = http.post(f"/sandboxes/{sandbox.sandbox_id}/apply_patch", json={"patch": "x", "cwd": "/tmp\x00/x"})
        assert r.status_code != 500 and (400 <= r.status_code < 500 or r.json()["success"] is False), r.text
    finally:
        service_ok()


def test_lone_surrogates_in_valid_fields_are_4xx(sandbox, http, service_ok):
    """Lone UTF-16 surrogates in exec, upload, create and apply_patch fields: refused by validation (422)."""
    sid = sandbox.sandbox_id
    cases = [("/sandboxes", b'{"image": "host\\ud800"}'),
             (f"/sandboxes/{sid}/exec", b'{"command": "echo \\ud800", "wait": true}'),
             (f"/sandboxes/{sid}/exec", b'{"command": ["echo", "\\udfff"], "wait": true}'),
             (f"/sandboxes/{sid}/files", b'{"path": "/tmp/\\ud800", "content": ""}'),
             (f"/sandboxes/{sid}/apply_patch", b'{"patch": "\\ud800"}')]
    try:
        for route, raw in cases:
            r = http.post(route, content=raw, headers={"Content-Type": "application/json"})
            assert 400 <= r.status_code < 500 or (r.status_code == 200 and r.json().get("status") == "failed"), \
                (route, raw, r.status_code, r.text[:200])
    finally:
        for s in http.get("/sandboxes").json()["sandboxes"]:
            if s["image"].startswith("host") and s["image"] != "host":
                http.delete(f"/sandboxes/{s['sandbox_id']}")
        service_ok()
