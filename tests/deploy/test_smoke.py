"""scripts/smoke.py against a real service started here (local backend), so the script is known to work."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from orchard.env.runner import ServiceProcess

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "smoke.py"
KEY = "smoke-key-1"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with ServiceProcess(state_dir=tmp_path_factory.mktemp("smoke-state"), env={"ORCHARD_API_KEYS": KEY},
                        args=[]) as svc:
        yield svc


@pytest.fixture
def listener():
    """A TCP port on this machine's loopback that answers, as the probe a blocked sandbox must not reach."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


def smoke(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


def test_every_check_passes_against_a_working_service(service, listener):
    result = smoke("--url", service.url, "--api-key", KEY, "--probe", f"127.0.0.1:{listener}")
    assert result.returncode == 0, result.stdout + result.stderr
    for check in ("health", "create", "exec", "exec exit code", "files round trip", "block_network", "delete"):
        assert f"PASS {check} " in result.stdout, result.stdout
    assert result.stdout.rstrip().endswith("all checks passed")


class _Model(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_the_model_endpoint_check(tmp_path):
    """A closed sandbox reaches an allow-listed HTTP target through model_endpoint; one outside the allowlist fails."""
    model = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Model)
    threading.Thread(target=model.serve_forever, daemon=True).start()
    target = f"127.0.0.1:{model.server_address[1]}"
    env = {"ORCHARD_API_KEYS": KEY, "ORCHARD_FORWARD_ALLOWLIST": target}
    try:
        with ServiceProcess(state_dir=tmp_path / "state", env=env, args=[]) as svc:
            ok = smoke("--url", svc.url, "--api-key", KEY, "--probe", "127.0.0.1:9", "--model-endpoint", target)
            assert ok.returncode == 0 and "PASS model_endpoint of a closed sandbox" in ok.stdout, ok.stdout + ok.stderr
            refused = smoke("--url", svc.url, "--api-key", KEY, "--probe", "127.0.0.1:9",
                            "--model-endpoint", "127.0.0.1:1")
            assert refused.returncode == 1 and "FAIL model_endpoint of a closed sandbox" in refused.stdout
    finally:
        model.shutdown()


def test_a_wrong_key_fails_with_the_reason(service):
    result = smoke("--url", service.url, "--api-key", "not-a-key")
    assert result.returncode == 1
    assert "FAIL create: ForbiddenError: Invalid API key" in result.stdout and "FAILED: create" in result.stdout


def test_an_unreachable_service_fails_health(service):
    result = smoke("--url", "http://127.0.0.1:9", "--api-key", KEY)
    assert result.returncode == 1 and "FAIL health" in result.stdout


def test_bad_arguments_are_refused():
    result = smoke("--url", "http://127.0.0.1:9", "--probe", "no-port")
    assert result.returncode == 2 and "expected HOST:PORT" in result.stderr
