"""The attack suite: every test is one attempt to break out of a sandbox or past the API, which must fail.

It reuses the contract suite's fixtures (a real service on a real uvicorn, keys A, B and admin, small
limits: 16 MiB bodies, 4 MiB files, 512 MiB memory, 256 MiB disk, 256 pids). After each attack the test
checks that the service still serves others: /health answers and a sandbox of another tenant (key B,
alive for the whole session) still runs commands.

Tests that look at the host side (host pids, host files, cgroup files) only make sense when the service
runs on this machine; they skip when ORCHARD_TEST_URL points elsewhere.
"""

from __future__ import annotations

import base64
import os
import secrets
import subprocess
import time
from typing import Optional, Union

import httpx
import pytest

from orchard import SandboxClient
from tests.env.contract.conftest import *  # noqa: F401,F403  (service, url, client, sandbox, http, model_server)
from tests.env.contract.conftest import ADMIN, IMAGE, KEY_A, KEY_B  # noqa: F401

EXTERNAL = bool(os.environ.get("ORCHARD_TEST_URL"))
local_only = pytest.mark.skipif(EXTERNAL, reason="looks at the host side of a service running on this machine")


@pytest.fixture(scope="session")
def tenant_b(service):
    """A client of the other tenant (key B), for the whole session."""
    with SandboxClient(base_url=service.url, api_key=os.environ.get("ORCHARD_TEST_KEY_B", KEY_B)) as c:
        yield c


@pytest.fixture(scope="session")
def bystander(tenant_b):
    """A sandbox of another tenant that every attack must leave working."""
    sb = tenant_b.create_sandbox(IMAGE, timeout=60)
    yield sb
    try:
        sb.delete()
    except Exception:
        pass


@pytest.fixture
def service_ok(service, bystander):
    """Call it after an attack: the service answers and another tenant's sandbox still runs commands."""

    def check(deadline: float = 30.0) -> None:
        end = time.monotonic() + deadline
        while True:
            try:
                health = httpx.get(service.url + "/health", timeout=10)
                r = bystander.exec(["echo", "bystander-ok"], timeout=30)
                assert health.status_code == 200 and health.json() == {"status": "healthy"}
                assert r.exit_code == 0 and r.stdout == "bystander-ok\n", r
                return
            except (httpx.HTTPError, AssertionError):
                if time.monotonic() > end:
                    raise
                time.sleep(0.5)

    return check


@pytest.fixture
def http_b(url):
    """Raw HTTP with key B."""
    with httpx.Client(base_url=url, headers={"X-API-Key": KEY_B}, timeout=60) as c:
        yield c


@pytest.fixture
def host_secret(tmp_path):
    """A host file with unguessable content that no sandbox may read."""
    token = "HOST-SECRET-" + secrets.token_hex(16)
    path = tmp_path / "host-secret.txt"
    path.write_text(token + "\n")
    os.chmod(tmp_path, 0o755)
    return path, token


@pytest.fixture
def host_sleep():
    """A host process a sandbox must neither see nor signal nor trace: its pid."""
    marker = f"{4000 + secrets.randbelow(5000)}.{secrets.randbelow(10**6)}"
    proc = subprocess.Popen(["sleep", marker])
    yield proc
    proc.kill()
    proc.wait()


def host_ipv4() -> list[str]:
    """This machine's own IPv4 addresses (loopback included), from `ip -4 -o addr`."""
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    addrs = {line.split()[3].split("/")[0] for line in out.splitlines() if len(line.split()) > 3}
    return sorted(addrs | {"127.0.0.1"})


def run_py(sb, code: str, timeout: float = 60, env: Optional[dict[str, str]] = None):
    """Upload a Python script into the sandbox and run it there (no shell quoting of the code)."""
    path = f"/tmp/attack-{secrets.token_hex(4)}.py"
    sb.upload_content(code, path)
    return sb.exec(["python3", path], timeout=timeout, env=env)


def b64(data: Union[str, bytes]) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()
