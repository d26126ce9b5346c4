"""Render the Helm chart with Helm's own engine (helm-python-sdk binds the Helm Go SDK) and hand tests the objects."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import pytest
import yaml

helm = pytest.importorskip("helm_python", reason="the deploy extra (helm-python-sdk) is not installed")

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "orchard"
KEYS = {"apiKeys": {"keys": ["key-a"], "adminKeys": ["admin-b"]}}


def render(values: Optional[dict[str, Any]] = None, release: str = "orchard", namespace: str = "default") -> list[dict]:
    """The objects `helm install` would send for these values (NOTES.txt left out, empty documents dropped)."""
    with helm.Chart.load(str(CHART)) as chart:
        files = chart.render(values if values is not None else KEYS, name=release, namespace=namespace, is_install=True)
    objects = []
    for path, text in sorted(files.items()):
        if path.endswith(".yaml"):
            objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def find(objects: list[dict], kind: str, name: Optional[str] = None) -> list[dict]:
    """Objects of a kind (and name)."""
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: list[dict], kind: str, name: Optional[str] = None) -> dict:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def container_env(deployment: dict) -> dict[str, dict]:
    """name -> env entry of the service container."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e for e in container["env"]}


@pytest.fixture(scope="session")
def objects() -> list[dict]:
    return render()
