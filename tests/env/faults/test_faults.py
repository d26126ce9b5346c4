"""Faults as tests: each starts its own service; the full-size runs are marked slow (`make test-slow`)."""

from __future__ import annotations

import pytest

from orchard.env import faults


def _ok(result: dict) -> None:
    assert result["ok"], result
    assert result.get("leaks", []) == []


def test_sigkill_during_commands():
    result = faults.sigkill_under_load(commands=40, sandboxes=8)
    _ok(result)
    assert result["results_lost"] == 0 and result["left_running"] == 0


def test_sandbox_killed_from_outside():
    result = faults.killed_from_outside()
    _ok(result)
    assert result["exec_status"] == 404


def test_client_disconnects_leave_no_process():
    _ok(faults.disconnects())


def test_delete_races_create_and_exec():
    result = faults.delete_races(rounds=10)
    _ok(result)


@pytest.mark.slow
def test_sigkill_during_200_commands():
    _ok(faults.sigkill_under_load(commands=200, sandboxes=20))


@pytest.mark.slow
def test_delete_races_at_scale():
    _ok(faults.delete_races(rounds=100))


@pytest.mark.slow
def test_timeouts_fire_under_load():
    _ok(faults.timeouts_under_load(n=30))
