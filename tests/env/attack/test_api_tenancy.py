"""Through the API: another tenant's sandboxes, jobs and images; keys on every route; the PTY WebSocket."""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
import time
from pathlib import Path
from typing import Optional

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from orchard import SandboxClient, SandboxFailedError

from .conftest import ADMIN, IMAGE, KEY_A, KEY_B, b64, local_only

PUBLIC = {"/", "/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}


def _detail(r: httpx.Response, sid: str) -> str:
    return r.json()["detail"].replace(sid, "<id>")


def test_another_tenants_sandbox_is_404_everywhere(sandbox, http, http_b, service_ok):
    """Key B gets exactly the reply it gets for an id that does not exist, on every route, and nothing it
    sends has any effect on key A's sandbox."""
    sid = sandbox.sandbox_id
    job = http.post(f"/sandboxes/{sid}/exec", json={"command": "echo a-secret-output", "wait": True}).json()
    ghost = "a" + secrets.token_hex(6)[1:]
    calls = [("GET", "/sandboxes/{}", None, None), ("GET", "/sandboxes/{}/wait", {"timeout": 1}, None),
             ("POST", "/sandboxes/{}/heartbeat", None, None),
             ("POST", "/sandboxes/{}/exec", None, {"command": "touch /workspace/b-was-here", "wait": True}),
             ("POST", "/sandboxes/{}/files", None, {"path": "/workspace/b-was-here", "content": b64("B")}),
             ("GET", "/sandboxes/{}/files", {"path": "/etc/hostname"}, None),
             ("GET", "/sandboxes/{}/files/list", {"path": "/workspace"}, None),
             ("POST", "/sandboxes/{}/apply_patch", None, {"patch": "x"}),
             ("POST", "/sandboxes/{}/snapshot", None, {"image": "stolen-" + secrets.token_hex(3)})]
    for method, path, params, body in calls:
        mine = http_b.request(method, path.format(sid), params=params, json=body)
        none = http_b.request(method, path.format(ghost), params=params, json=body)
        assert mine.status_code == 404 == none.status_code, (method, path, mine.status_code, mine.text[:200])
        assert _detail(mine, sid) == _detail(none, ghost), (method, path)      # no existence oracle
    for path in (f"/jobs/{job['job_id']}", f"/jobs/{job['job_id']}/wait"):
        r = http_b.get(path, params={"timeout": 1} if path.endswith("wait") else None)
        assert r.status_code == 404 and "a-secret-output" not in r.text, (path, r.status_code)
    assert http_b.delete(f"/sandboxes/{sid}").status_code == 200                  # idempotent, and a no-op
    assert sid not in {s["sandbox_id"] for s in http_b.get("/sandboxes").json()["sandboxes"]}
    assert sid not in {s["sandbox_id"] for s in http_b.get("/sandboxes", params={"status": "ready"}).json()["sandboxes"]}
    assert sid not in http_b.get("/resources").text and sid not in http_b.get("/metrics").text
    info = http.get(f"/sandboxes/{sid}").json()
    assert info["status"] == "ready" and info.get("last_heartbeat") is None
    assert sandbox.exec("ls /workspace; echo end").stdout == "end\n"
    service_ok()


def _pty(url: str, sid: str, key: Optional[str] = None, via: str = "query",
         init: Optional[dict] = None) -> tuple[list[dict], Optional[int]]:
    """Open the PTY WebSocket, send an init frame, return the frames received and the close code."""
    ws_url = url.replace("http", "ws", 1) + f"/sandboxes/{sid}/exec/pty"
    kwargs: dict = {"open_timeout": 15, "close_timeout": 5}
    if key is not None and via == "query":
        ws_url += f"?api_key={key}"
    elif key is not None and via == "subprotocol":
        kwargs["subprotocols"] = [f"api_key.{key}"]
    elif key is not None and via == "header":
        kwargs["additional_headers"] = {"X-API-Key": key}
    frames: list[dict] = []
    init = init or {"type": "init", "cmd": ["touch", "/workspace/pty-was-here"]}
    try:
        with connect(ws_url, **kwargs) as ws:
            try:
                try:
                    ws.send(json.dumps(init))
                except ConnectionClosed:
                    pass                            # refused before the init frame: read what was said
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline:
                    frames.append(json.loads(ws.recv(timeout=15)))
            except (ConnectionClosed, TimeoutError):
                pass
            return frames, ws.close_code
    except InvalidStatus as e:                      # refused at the handshake: as good as an error frame
        return [{"type": "error", "message": f"HTTP {e.response.status_code}"}], 4400


def test_pty_websocket_refuses_missing_wrong_and_foreign_keys(sandbox, url, service_ok):
    """PTY WebSocket without a key, with a wrong key, or on another key's sandbox: error frame, close 4400, no process started."""
    sid = sandbox.sandbox_id
    ghost = "b" + secrets.token_hex(6)[1:]
    cases = [(sid, None, "query"), (sid, "wrong-key", "query"), (sid, "wrong-key", "subprotocol"),
             (sid, KEY_B, "query"), (sid, KEY_B, "subprotocol"), (sid, KEY_B, "header"), (sid, "", "query"),
             (sid, KEY_A.upper(), "query"), (ghost, KEY_A, "query"), ("UPPER", KEY_A, "query"),
             ("a%2F..%2F..", KEY_A, "query"), ("%2e%2e", KEY_A, "subprotocol")]
    messages = {}
    for target, key, via in cases:
        frames, code = _pty(url, target, key, via)
        assert frames and frames[0]["type"] == "error" and code == 4400, (target, key, via, frames, code)
        assert not any(f["type"] in ("ready", "stdout", "exit") for f in frames), (target, key, via, frames)
        messages[(target, key, via)] = frames[0]["message"].replace(target, "<id>")
    # another tenant learns nothing: its refusal reads exactly like the one for an id that does not exist
    assert messages[(sid, KEY_B, "query")] == messages[(ghost, KEY_A, "query")]
    assert sandbox.exec("ls /workspace; echo end").stdout == "end\n"          # no session ever started
    service_ok()


def test_pty_malformed_init_gets_an_error_frame(sandbox, url, service_ok):
    """PTY init frames with NUL bytes or an empty command: error frame and close 4400, not a dropped socket."""
    sid = sandbox.sandbox_id
    try:
        for init in ({"type": "init", "cmd": ["tr\x00ue"]}, {"type": "init", "cmd": ["true"], "cwd": "/tmp\x00"},
                     {"type": "init", "cmd": ["true"], "env": {"A": "b\x00"}}, {"type": "init", "cmd": []}):
            frames, code = _pty(url, sid, KEY_A, "query", init)
            assert frames and frames[0]["type"] == "error" and code == 4400, (init, frames, code)
    finally:
        service_ok()


def test_pty_malformed_frames_are_refused(sandbox, url, service_ok):
    """Malformed PTY frames after init: answered with an error frame; the session and service go on."""
    sid = sandbox.sandbox_id
    for init in ({"type": "stdin", "data": "eA=="}, {"type": "init", "cmd": "not-a-list"}, {"cmd": ["true"]},
                 {"type": "init", "cmd": ["true"], "rows": 10**9}, {"type": "init", "cmd": ["true"], "rows": -1},
                 {"type": "init", "cmd": [5]}, {"type": "init", "cmd": ["true"], "env": {"A": 1}}):
        frames, code = _pty(url, sid, KEY_A, "query", init)
        assert frames and frames[0]["type"] == "error" and code == 4400, (init, frames, code)
    service_ok()


def test_ids_are_unguessable_and_listing_is_private(client, http, http_b, url, service_ok):
    """Enumerating sandbox and job ids: 12/32 random hex characters, and listings show only the caller's own."""
    sandboxes = [client.create_sandbox(IMAGE) for _ in range(6)]
    try:
        ids = [s.sandbox_id for s in sandboxes]
        assert all(re.fullmatch(r"[0-9a-f]{12}", i) for i in ids), ids
        assert len(set(ids)) == len(ids)
        for a in ids:                              # no shared prefix, no counter: about half the digits differ
            for b in ids:
                if a != b:
                    assert sum(x != y for x, y in zip(a, b)) >= 4, (a, b)
        ints = sorted(int(i, 16) for i in ids)
        assert min(b - a for a, b in zip(ints, ints[1:])) > 1000
        jobs = [http.post(f"/sandboxes/{ids[0]}/exec", json={"command": "true"}).json()["job_id"] for _ in range(4)]
        assert all(re.fullmatch(r"[0-9a-f]{32}", j) for j in jobs) and len(set(jobs)) == 4
        assert not set(ids) & {s["sandbox_id"] for s in http_b.get("/sandboxes").json()["sandboxes"]}
        assert set(ids) <= {s["sandbox_id"] for s in http.get("/sandboxes").json()["sandboxes"]}
        with httpx.Client(base_url=url, headers={"X-API-Key": ADMIN}) as admin:
            assert set(ids) <= {s["sandbox_id"] for s in admin.get("/sandboxes").json()["sandboxes"]}
    finally:
        for s in sandboxes:
            s.delete()
    service_ok()


def test_every_route_but_root_and_health_needs_a_valid_key(sandbox, http, url, service_ok):
    """Every route but / and /health without a key or with a wrong one (also via query, Bearer or cookie): 401/403."""
    sid = sandbox.sandbox_id
    job = http.post(f"/sandboxes/{sid}/exec", json={"command": "true", "wait": True}).json()["job_id"]
    spec = httpx.get(url + "/openapi.json").json()
    bodies = {"/sandboxes": {"image": IMAGE}, "/exec": {"command": "touch /workspace/unauth"},
              "/files": {"path": "/workspace/unauth", "content": b64("x")}, "/apply_patch": {"patch": "x"},
              "/snapshot": {"image": "unauth-snap"}}
    checked = 0
    for template, methods in spec["paths"].items():
        if template in PUBLIC:
            continue
        path = template.replace("{sandbox_id}", sid).replace("{job_id}", job)
        for method in methods:
            body = next((v for k, v in bodies.items() if path.endswith(k)), None) if method == "post" else None
            params = {"path": "/etc/hostname"} if path.endswith("/files") and method == "get" else None
            for headers, status, detail in (
                    ({}, 401, "Missing API key. Please provide X-API-Key header."),
                    ({"X-API-Key": ""}, 401, None),
                    ({"X-API-Key": "wrong"}, 403, "Invalid API key"),
                    ({"X-API-Key": KEY_A.upper()}, 403, None), ({"X-API-Key": KEY_A[:-1]}, 403, None),
                    ({"X-API-Key": KEY_A + "x"}, 403, None),
                    ({"Authorization": f"Bearer {KEY_A}"}, 401, None), ({"Cookie": f"api_key={KEY_A}"}, 401, None)):
                r = httpx.request(method.upper(), url + path, headers=headers, json=body, params=params, timeout=30)
                assert r.status_code == status, (method, template, headers, r.status_code, r.text[:200])
                assert detail is None or r.json()["detail"] == detail
            # a key in the query string is for the WebSocket only
            r = httpx.request(method.upper(), url + path, params={**(params or {}), "api_key": KEY_A}, json=body, timeout=30)
            assert r.status_code == 401, (method, template, r.status_code)
            checked += 1
    assert checked >= 12, spec["paths"].keys()
    assert http.get(f"/sandboxes/{sid}").json()["status"] == "ready"        # the unauthenticated DELETE did nothing
    assert sandbox.exec("ls /workspace; echo end").stdout == "end\n"
    for path in ("/", "/health"):
        assert httpx.get(url + path).status_code == 200
    service_ok()


@pytest.fixture
def a_snapshot(client):
    """A snapshot made by key A with a secret in it: (image name, secret)."""
    name, secret = f"attack-{secrets.token_hex(4)}:v1", "A-SNAPSHOT-SECRET-" + secrets.token_hex(8)
    with client.create_sandbox(IMAGE) as sb:
        sb.exec(f"echo {secret} > /workspace/secret.txt")
        sb.snapshot(name)
    return name, secret


def test_another_tenant_cannot_boot_or_list_my_snapshot(a_snapshot, tenant_b, service_ok):
    """Key B starting or listing key A's snapshot: snapshots are per owner, so the name is unknown to B."""
    name, secret = a_snapshot
    try:
        with pytest.raises(SandboxFailedError) as err:
            with tenant_b.create_sandbox(name, timeout=60) as sb:
                leaked = sb.exec("cat /workspace/secret.txt").stdout
                assert secret not in leaked
        listing = str(err.value.detail).split("Available:", 1)[-1]     # the message quotes what B asked for
        assert name not in listing, err.value.detail
        with pytest.raises(SandboxFailedError) as err:
            tenant_b.create_sandbox("no-such-image-" + secrets.token_hex(3), timeout=60)
        assert name.split(":")[0] not in str(err.value.detail), err.value.detail
    finally:
        service_ok()


def test_another_tenant_cannot_replace_my_snapshot(a_snapshot, client, tenant_b, service_ok):
    """Key B snapshotting under the name of key A's snapshot: B gets its own image; A's stays as it was."""
    name, secret = a_snapshot
    try:
        with tenant_b.create_sandbox(IMAGE) as sb:
            sb.exec("echo POISONED-BY-B > /workspace/secret.txt")
            try:
                sb.snapshot(name)
            except Exception:
                pass                              # refused: what should happen
        with client.create_sandbox(name) as mine:
            assert mine.exec("cat /workspace/secret.txt").stdout == secret + "\n"
    finally:
        service_ok()


def _fake_root(parent: Path, token: str) -> Path:
    root = parent / "home-like"
    (root / "bin").mkdir(parents=True)
    (root / "notes.txt").write_text(token)
    os.chmod(parent, 0o755)
    return root


@local_only
def test_image_paths_inside_the_state_dir_are_refused(client, service, service_ok):
    """Booting the service's state dir as a directory image: refused."""
    for path in (service.state_dir, service.state_dir / "images" / "host" / "root", service.state_dir / "sandboxes"):
        with pytest.raises(SandboxFailedError):
            client.create_sandbox(str(path), timeout=60)
    service_ok()


@local_only
def test_image_paths_inside_work_are_refused(client, service_ok):
    """Booting a directory under /work (or another hidden host path) as an image: refused."""
    inside = next((p for p in (Path(sys.prefix), Path(__file__).resolve().parents[3] / ".venv")
                   if str(p).startswith("/work/") and (p / "bin").is_dir()), None)
    if inside is None:
        pytest.skip("no directory with bin/ under /work on this machine")
    try:
        with pytest.raises(SandboxFailedError):
            with client.create_sandbox(str(inside), timeout=60) as sb:
                leaked = sb.download_content("/bin/activate")         # no shell there, but the file API works
                assert not leaked, "a file under /work was readable from a sandbox"
    finally:
        service_ok()


@local_only
def test_image_paths_cannot_expose_arbitrary_host_directories(client, tmp_path, service_ok):
    """Booting an arbitrary host directory holding bin/ or usr/: refused unless under ORCHARD_IMAGE_ROOTS."""
    token = "HOME-SECRET-" + secrets.token_hex(8)
    root = _fake_root(tmp_path, token)
    try:
        with pytest.raises(SandboxFailedError):
            with client.create_sandbox(str(root), timeout=60) as sb:
                assert token.encode() not in sb.download_content("/notes.txt")
    finally:
        service_ok()


@local_only
def test_snapshot_does_not_plant_setuid_files_for_host_users(model_server, tmp_path):
    """Planting a setuid-root file on the host through a snapshot: setuid/setgid bits are stripped and the state dir is 0700."""
    from orchard.env.runner import ServiceProcess
    from tests.env.contract.conftest import service_env

    state = tmp_path / "fresh-state"                 # created by the service's side, as in a deployment
    svc = ServiceProcess(state_dir=state, env=service_env(model_server), args=[]).start()
    try:
        with SandboxClient(base_url=svc.url, api_key=KEY_A) as c:
            with c.create_sandbox(IMAGE, timeout=60) as sb:
                sb.exec("cp /bin/bash /workspace/rootsh && chmod 4755 /workspace/rootsh")
                sb.snapshot("suid-" + secrets.token_hex(3))
        exposed = []
        for top, _, files in os.walk(state / "images"):
            for name in files:
                path = Path(top) / name
                st = path.lstat()
                if st.st_mode & 0o6000 and st.st_uid == 0 and st.st_mode & 0o001:
                    chain = [state, *[p for p in path.parents if state in p.parents]]
                    if all(p.stat().st_mode & 0o001 for p in chain):
                        exposed.append(str(path))
        assert exposed == [], f"setuid-root files any host user can run: {exposed}"
    finally:
        svc.stop()
