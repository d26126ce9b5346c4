"""Exec jobs: shells and argvs, exit codes, timeouts, output caps, order, durability of results."""

from __future__ import annotations

import time

import pytest

from orchard import NotFoundError


def test_string_runs_under_bash(sandbox):
    r = sandbox.exec("echo $0; echo out; echo err >&2; exit 3")
    assert (r.status, r.exit_code, r.error) == ("failed", 3, None)
    assert r.stdout == "bash\nout\n" and r.stderr == "err\n"
    assert not r.succeeded and r.failed and r.is_complete


def test_argv_runs_without_shell_and_keeps_quoting(sandbox):
    r = sandbox.exec(["printf", "%s|", "a b", "$HOME", "'q'", "*"])
    assert r.succeeded and r.stdout == "a b|$HOME|'q'|*|"


def test_commands_of_any_length(sandbox):
    arg = "x" * 100_000
    r = sandbox.exec(["python3", "-c", "import sys; print(len(sys.argv[1]))", arg])
    assert r.stdout.strip() == "100000"
    r = sandbox.exec(f"echo {'y' * 2_000_000} | wc -c")
    assert r.stdout.strip() == "2000001"
    r = sandbox.exec("cat <<'EOF'\n" + "z" * 300_000 + "\nEOF\necho $0", login_shell=True)
    assert r.stdout.startswith("zzz") and r.exit_code == 0


def test_env_and_cwd(sandbox):
    sandbox.exec("mkdir -p /srv/app")
    r = sandbox.exec("pwd; echo $FOO", cwd="/srv/app", env={"FOO": "bar baz"})
    assert r.stdout == "/srv/app\nbar baz\n"
    assert sandbox.exec("pwd").stdout.strip() == "/workspace"


def test_missing_cwd_is_a_failed_job_that_says_so(sandbox):
    r = sandbox.exec("pwd", cwd="/does/not/exist")
    assert r.status == "failed" and "/does/not/exist" in (r.error or "")


def test_unknown_program_is_127(sandbox):
    r = sandbox.exec(["no-such-program-xyz"])
    assert r.exit_code == 127 and r.status == "failed"


def test_timeout_kills_only_the_command_tree(sandbox):
    t = time.monotonic()
    r = sandbox.exec("echo started; (sleep 300 &); sleep 300", timeout=1)
    assert time.monotonic() - t < 15
    assert (r.status, r.exit_code) == ("failed", 124)
    assert r.error == "Execution timed out after 1s" and r.stdout == "started\n"
    assert sandbox.exec("echo alive").stdout == "alive\n"
    assert "sleep 300" not in sandbox.exec("ps -eo args").stdout


def test_non_positive_timeout_is_422(http, sandbox):
    for bad in (0, -5):
        r = http.post(f"/sandboxes/{sandbox.sandbox_id}/exec", json={"command": "true", "timeout_seconds": bad})
        assert r.status_code == 422


def test_background_child_does_not_hold_the_job(sandbox):
    t = time.monotonic()
    r = sandbox.exec("sleep 30 & echo done")
    assert r.succeeded and r.stdout == "done\n" and time.monotonic() - t < 10


def test_output_is_capped_and_flagged(http, sandbox):
    r = http.post(f"/sandboxes/{sandbox.sandbox_id}/exec",
                  json={"command": "head -c 3000000 /dev/zero | tr '\\0' a; echo tail >&2", "wait": True}).json()
    assert r["status"] == "succeeded" and r["stdout_truncated"] is True and len(r["stdout"]) == 2**20
    assert r["stderr"] == "tail\n" and r["stderr_truncated"] is False


def test_queued_job_then_wait(http, sandbox):
    r = http.post(f"/sandboxes/{sandbox.sandbox_id}/exec", json={"command": "sleep 0.3; echo hi"})
    body = r.json()
    assert r.status_code == 200 and body["status"] == "queued" and body["job_id"]
    job = http.get(f"/jobs/{body['job_id']}/wait", params={"timeout": 30}).json()
    assert job["status"] == "succeeded" and job["stdout"] == "hi\n" and job["sandbox_id"] == sandbox.sandbox_id
    assert job["started_at"] >= job["created_at"] and job["completed_at"] >= job["started_at"]
    assert http.get(f"/jobs/{body['job_id']}").json() == job


def test_wait_timeout_returns_running_not_finished(http, sandbox):
    job_id = http.post(f"/sandboxes/{sandbox.sandbox_id}/exec", json={"command": "sleep 3"}).json()["job_id"]
    job = http.get(f"/jobs/{job_id}/wait", params={"timeout": 0.5}).json()
    assert job["status"] in ("queued", "running") and job["exit_code"] is None
    assert sandbox.get_job(job_id).status in ("queued", "running")


def test_execs_in_one_sandbox_run_in_order(http, sandbox):
    ids = [http.post(f"/sandboxes/{sandbox.sandbox_id}/exec",
                     json={"command": f"sleep 0.0{9 - i}; echo {i} >> /tmp/order"}).json()["job_id"] for i in range(8)]
    for job_id in ids:
        http.get(f"/jobs/{job_id}/wait", params={"timeout": 30})
    assert sandbox.exec("cat /tmp/order").stdout.split() == [str(i) for i in range(8)]


def test_idempotency_key_runs_once(http, sandbox):
    body = {"command": "echo x >> /tmp/idem; wc -l < /tmp/idem", "wait": True}
    first = http.post(f"/sandboxes/{sandbox.sandbox_id}/exec", json=body, headers={"Idempotency-Key": "k-1"}).json()
    again = http.post(f"/sandboxes/{sandbox.sandbox_id}/exec", json=body, headers={"Idempotency-Key": "k-1"}).json()
    assert first["job_id"] == again["job_id"] and sandbox.exec("wc -l < /tmp/idem").stdout.strip() == "1"


def test_exec_after_delete_is_404(client):
    sb = client.create_sandbox("host")
    sb.delete()
    with pytest.raises(NotFoundError):
        client.get_sandbox(sb.sandbox_id).exec("true")


def test_login_shell(sandbox):
    sandbox.exec("echo 'export FROM_RC=yes' >> ~/.bashrc")
    assert sandbox.exec("echo $FROM_RC", login_shell=True).stdout.strip() == "yes"
    assert sandbox.exec("echo ${FROM_RC:-no}").stdout.strip() == "no"
