"""deploy/render.py: the chart's objects for `kubectl apply`, in Helm's install order, with clear failures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from tests.deploy.conftest import render

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "render.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_it_prints_the_objects_helm_would_install_namespaces_first(tmp_path):
    values = tmp_path / "mine.yaml"
    values.write_text("replicas: 5\napiKeys:\n  keys: [key-a]\n  adminKeys: [admin-b]\nredis:\n  password: Pw1\n")
    result = run("-f", str(values), "--set", "replicas=2")
    assert result.returncode == 0, result.stderr
    printed = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    assert sorted((o["kind"], o["metadata"]["name"]) for o in printed) == \
        sorted((o["kind"], o["metadata"]["name"]) for o in render())
    kinds = [o["kind"] for o in printed]
    assert kinds[:2] == ["Namespace", "Namespace"]
    assert kinds.index("Deployment") > kinds.index("Secret") > kinds.index("ServiceAccount")
    assert next(o for o in printed if o["kind"] == "Deployment")["spec"]["replicas"] == 2, "--set wins over -f"


def test_a_bad_value_fails_with_helms_message():
    result = run("--set", "replicas=three", "--set", "apiKeys.keys={k}", "--set", "redis.password=Pw1")
    assert result.returncode == 1
    assert "render failed" in result.stderr and "/replicas" in result.stderr


def test_it_refuses_to_invent_a_redis_password_on_every_run():
    result = run("--set", "apiKeys.keys={k}")
    assert result.returncode == 1 and "give redis.password or redis.existingSecret" in result.stderr
