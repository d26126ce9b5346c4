"""The two Dockerfiles, read as data: stages, users, paths that exist, and the agent paths the backend expects.

No image is built here (no registry to pull python:3.11-slim from); test_agent_bundle.py runs the same
bundling script on this machine's Python instead.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from orchard.env import agent
from orchard.env.backends import kubernetes_pods

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    logical, current = [], ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") and not current:
            continue
        current += line.rstrip("\\").strip() + " " if line.endswith("\\") else line.strip()
        if not line.endswith("\\"):
            if current:
                logical.append(current)
            current = ""
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1] if " " in text else "") for text in logical]


def stages(path: Path) -> list[list[tuple[str, str]]]:
    """Instructions grouped by FROM."""
    groups: list[list[tuple[str, str]]] = []
    for op, args in instructions(path):
        if op == "FROM":
            groups.append([])
        groups[-1].append((op, args))
    return groups


def copies(path: Path) -> list[tuple[list[str], str, str]]:
    """(sources, destination, --from stage or '') of every COPY."""
    found = []
    for op, args in instructions(path):
        if op == "COPY":
            words = shlex.split(args)
            source = next((w.split("=", 1)[1] for w in words if w.startswith("--from=")), "")
            paths = [w for w in words if not w.startswith("--")]
            found.append((paths[:-1], paths[-1], source))
    return found


@pytest.mark.parametrize("name", ["service.Dockerfile", "agent.Dockerfile"])
def test_every_copied_path_exists_and_every_stage_is_named(name):
    path = DOCKER / name
    names = [args.split()[-1] for op, args in instructions(path) if op == "FROM" and " AS " in f" {args} ".upper()]
    for sources, _, stage in copies(path):
        if stage:
            assert stage in names, f"{name}: COPY --from={stage} names no earlier stage"
            continue
        for source in sources:
            assert (ROOT / source).exists(), f"{name}: COPY {source}: no such path in the repository"
            assert _not_ignored(DOCKER / f"{name}.dockerignore", source), f"{name}: {source} is excluded by its .dockerignore"


def _not_ignored(ignore: Path, source: str) -> bool:
    """Our .dockerignore files exclude everything and re-include paths with '!': the source must be re-included."""
    kept = [line[1:].rstrip("/") for line in ignore.read_text().splitlines() if line.startswith("!")]
    return any(source.rstrip("/") == k or source.startswith(k + "/") for k in kept)


def test_the_service_image_runs_as_a_non_root_user_and_serves():
    final = stages(DOCKER / "service.Dockerfile")[-1]
    users = [args for op, args in final if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert json.loads(dict(final)["ENTRYPOINT"]) == ["orchard", "env", "serve"]
    runs = " ".join(args for op, args in instructions(DOCKER / "service.Dockerfile") if op == "RUN")
    assert '".[server,k8s]"' in runs
    assert "k8s" in _extras(), "pyproject.toml has no k8s extra for the service image"


def _extras() -> set[str]:
    import tomllib

    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def test_the_agent_image_holds_what_the_backend_runs():
    final = stages(DOCKER / "agent.Dockerfile")[-1]
    assert final[0] == ("FROM", "scratch")
    home = agent.HOME
    python_dir = str(Path(agent.PYTHON).parent.parent)
    runs = " ".join(args for op, args in instructions(DOCKER / "agent.Dockerfile") if op == "RUN")
    assert f"bundle-python /usr/local/bin/python3.11 {python_dir}" in runs
    assert (["src/orchard/env/agent/"], f"{agent.LIB}/{agent.PACKAGE}/", "") in copies(DOCKER / "agent.Dockerfile")
    assert ([home], home, "bundle") in copies(DOCKER / "agent.Dockerfile")
    assert json.loads(dict(final)["ENTRYPOINT"]) == [agent.PYTHON, "-I", "-c", agent.boot_code("install")]


def test_the_backend_runs_the_agent_from_the_image_paths():
    from orchard.env.backends.base import SandboxSpec
    from orchard.env.settings import Settings

    pod = kubernetes_pods.sandbox_pod(Settings(), SandboxSpec(sandbox_id="sbx1", image="busybox"), "busybox")
    [install] = pod["spec"]["initContainers"]
    [sandbox] = pod["spec"]["containers"]
    assert install["image"] == Settings().kube_agent_image == "orchard/agent:0.1.0"
    assert install["command"][0] == sandbox["command"][0] == agent.PYTHON
    mounts = {m["mountPath"]: m for m in sandbox["volumeMounts"]}
    assert mounts[agent.HOME]["readOnly"] is True
