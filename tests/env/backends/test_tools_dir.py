"""The tools folder (ORCHARD_TOOLS_DIR): every local sandbox sees it read-only at /opt/orchard/tools."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from orchard import SandboxClient
from orchard.env.backends.base import TOOLS_MOUNT
from orchard.env.runner import ServiceProcess
from orchard.env.settings import Settings

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the local backend needs root here")


@pytest.fixture(scope="module")
def tools(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tools")
    (root / "bin").mkdir()
    (root / "bin" / "greet").write_text("#!/bin/sh\necho hello from the tools folder\n")
    (root / "bin" / "greet").chmod(0o755)
    return root


@pytest.fixture(scope="module")
def client(tools, tmp_path_factory):
    svc = ServiceProcess(state_dir=tmp_path_factory.mktemp("state"),
                         env={"ORCHARD_TOOLS_DIR": str(tools), "ORCHARD_DEFAULT_MEMORY": "256Mi"})
    svc.start()
    try:
        with SandboxClient(base_url=svc.url) as c:
            yield c
    finally:
        svc.stop()


def test_tools_are_visible_and_runnable(client):
    with client.create_sandbox("host", timeout=60) as sb:
        result = sb.exec(f"{TOOLS_MOUNT}/bin/greet")
        assert result.exit_code == 0, result.stderr
        assert result.stdout == "hello from the tools folder\n"


def test_tools_are_read_only(client, tools):
    with client.create_sandbox("host", timeout=60) as sb:
        result = sb.exec(f"echo changed > {TOOLS_MOUNT}/bin/greet; touch {TOOLS_MOUNT}/new")
        assert result.exit_code != 0
        assert "Read-only file system" in result.stderr
    assert (tools / "bin" / "greet").read_text().endswith("echo hello from the tools folder\n")
    assert not (tools / "new").exists()


def test_relative_tools_dir_is_refused():
    with pytest.raises(ValidationError, match="absolute"):
        Settings(tools_dir="relative/tools")


def test_missing_tools_dir_stops_the_service(tmp_path):
    svc = ServiceProcess(state_dir=tmp_path / "state", env={"ORCHARD_TOOLS_DIR": str(tmp_path / "absent")})
    with pytest.raises(RuntimeError, match="tools_dir .* is not a directory"):
        svc.start(timeout=20)
    svc.stop()
