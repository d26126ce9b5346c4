"""Wire models, quantities and settings: validation that gives clear errors."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from orchard.env.protocol import CreateSandboxRequest, ExecRequest, SnapshotRequest
from orchard.env.quantities import parse_cpu, parse_memory
from orchard.env.settings import Settings


@pytest.mark.parametrize("text,cores", [("4", 4.0), ("0.5", 0.5), ("2000m", 2.0), ("250m", 0.25)])
def test_cpu_quantities(text, cores):
    assert parse_cpu(text) == cores


@pytest.mark.parametrize("text,size", [("512Mi", 512 * 2**20), ("2G", 2 * 10**9), ("1.5Gi", int(1.5 * 2**30)),
                                       ("1048576", 2**20), ("64k", 64000), ("1Ti", 2**40)])
def test_memory_quantities(text, size):
    assert parse_memory(text) == size


@pytest.mark.parametrize("bad", ["", "lots", "-1", "0", "1Xi", "1.2.3"])
def test_bad_quantities(bad):
    with pytest.raises(ValueError):
        parse_memory(bad)
    with pytest.raises(ValueError):
        parse_cpu(bad)


def test_create_request_defaults_and_ids():
    req = CreateSandboxRequest(image="host")
    assert req.block_network is True and req.sandbox_id is None and req.timeout is None
    assert CreateSandboxRequest(image="host", sandbox_id="a-1").sandbox_id == "a-1"
    for bad in ("A", "-a", "a-", "a" * 64, "a_b"):
        with pytest.raises(ValidationError):
            CreateSandboxRequest(image="host", sandbox_id=bad)
    assert CreateSandboxRequest(image="host", unknown_field=1).image == "host"     # old clients keep working


def test_exec_request_validation():
    assert ExecRequest(command=["ls", "-l"]).command == ["ls", "-l"]
    for bad in ({"command": []}, {"command": [""]}, {"command": "x", "timeout_seconds": 0},
                {"command": "x\x00y"}, {"command": "x", "env": {"A=B": "c"}}):
        with pytest.raises(ValidationError):
            ExecRequest(**bad)


def test_snapshot_names():
    assert SnapshotRequest(image="task-1:ready").image == "task-1:ready"
    for bad in ("Task", "host", "a b", ""):
        with pytest.raises(ValidationError):
            SnapshotRequest(image=bad)


def test_settings_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("ORCHARD_API_KEYS", "a, b")
    monkeypatch.setenv("ORCHARD_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("ORCHARD_FORWARD_ALLOWLIST", "127.0.0.1:8300")
    s = Settings()
    assert s.api_keys == ["a", "b"] and s.state_dir == tmp_path
    assert s.resolved_forward("127.0.0.1:8300") == ("127.0.0.1", 8300) and s.resolved_forward("x:1") is None
    with pytest.raises(ValidationError):
        Settings(not_a_setting=1)
    with pytest.raises(ValidationError):
        Settings(exec_timeout=0)
