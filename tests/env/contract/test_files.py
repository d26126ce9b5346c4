"""Files and apply_patch: paths resolve inside the sandbox's own view, limits give clear errors."""

from __future__ import annotations

import base64

import pytest

from orchard import NotFoundError, PayloadTooLargeError, RequestError


def test_upload_download_roundtrip_and_parents(sandbox):
    up = sandbox.upload_content(b"\x00binary\xff", "/data/deep/dir/f.bin")
    assert up.size == 8 and up.path == "/data/deep/dir/f.bin"
    assert sandbox.download_content("/data/deep/dir/f.bin") == b"\x00binary\xff"


def test_relative_paths_use_the_workdir(sandbox):
    sandbox.upload_content("hi", "rel/a.txt")
    assert sandbox.exec("cat /workspace/rel/a.txt").stdout == "hi"


def test_mode_is_applied(http, sandbox):
    body = {"path": "/opt/run.sh", "content": base64.b64encode(b"#!/bin/sh\necho ran\n").decode(), "mode": 0o755}
    assert http.post(f"/sandboxes/{sandbox.sandbox_id}/files", json=body).json()["success"] is True
    assert sandbox.exec("/opt/run.sh").stdout == "ran\n"


def test_list_sorted_with_types_and_broken_links(sandbox):
    sandbox.exec("mkdir -p /l/sub && echo 12345 > /l/b.txt && ln -s /nowhere /l/a-broken && ln -s b.txt /l/c-link")
    entries = sandbox.list_files("/l")
    assert [e.name for e in entries] == ["a-broken", "b.txt", "c-link", "sub"]
    kinds = {e.name: e.type for e in entries}
    assert kinds == {"a-broken": "symlink", "b.txt": "file", "c-link": "symlink", "sub": "directory"}
    assert next(e for e in entries if e.name == "b.txt").size == 6
    assert all("T" in e.modified for e in entries)


def test_errors_404_400_413(http, sandbox):
    sid = sandbox.sandbox_id
    assert http.get(f"/sandboxes/{sid}/files", params={"path": "/nope"}).status_code == 404
    assert http.get(f"/sandboxes/{sid}/files", params={"path": "/usr"}).status_code == 400
    assert http.get(f"/sandboxes/{sid}/files/list", params={"path": "/nope"}).status_code == 404
    assert http.get(f"/sandboxes/{sid}/files/list", params={"path": "/etc/hostname"}).status_code in (400, 404)
    r = http.post(f"/sandboxes/{sid}/files", json={"path": "/x", "content": "not base64!!"})
    assert r.status_code == 400
    with pytest.raises(PayloadTooLargeError):
        sandbox.upload_content(b"z" * (5 * 2**20), "/big")
    with pytest.raises(NotFoundError):
        sandbox.download_content("/missing/file")


def test_planted_links_never_reach_host_files(sandbox, tmp_path):
    secret = tmp_path / "host-secret.txt"
    secret.write_text("HOST SECRET")
    sandbox.exec(f"ln -s {secret} /workspace/abs; ln -s ../../../../../..{secret} /workspace/rel; "
                 "ln -s /proc/1/root /workspace/procroot")
    for path in ("/workspace/abs", "/workspace/rel", f"/workspace/procroot{secret}", f"/../../..{secret}"):
        try:
            data = sandbox.download_content(path)
        except (NotFoundError, RequestError):      # refused: as good as absent
            continue
        assert b"HOST SECRET" not in data, path
    try:
        sandbox.upload_content("sandbox side", "/workspace/abs")   # follows the link inside the sandbox, if at all
    except NotFoundError:
        pass
    assert secret.read_text() == "HOST SECRET"


PATCH = """diff --git a/hello.txt b/hello.txt
--- a/hello.txt
+++ b/hello.txt
@@ -1,2 +1,4 @@
 line one
+EOF
+'EOF'
 line two
"""


def test_apply_patch_in_workdir_and_cwd(sandbox):
    sandbox.exec("mkdir -p /testbed && cd /testbed && printf 'line one\\nline two\\n' > hello.txt "
                 "&& cp hello.txt /workspace/hello.txt")
    r = sandbox.apply_patch(PATCH, cwd="/testbed")
    assert r.success and r.exit_code == 0
    assert sandbox.exec("cat /testbed/hello.txt").stdout == "line one\nEOF\n'EOF'\nline two\n"
    assert sandbox.apply_patch(PATCH).success
    bad = sandbox.apply_patch(PATCH, cwd="/testbed")        # already applied: git refuses
    assert not bad.success and bad.exit_code != 0 and bad.stderr
