"""The agent image's bundling, run for real: the bundled Python and the agent work in a root that holds nothing else.

deploy/docker/bundle-python.sh bundles this machine's own interpreter here (the image bundles python:3.11-slim's);
bubblewrap then plays the two containers of a sandbox pod as kubernetes_pods builds it: the init container
(the agent image: only the bundle) copies the agent into a shared folder, and the sandbox container (an image
with no Python, no shell and no libc: an empty root) starts the agent from that copy. The test talks to it
with the backend's own agent client.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from orchard.env import agent
from orchard.env.backends import kubernetes_pods
from orchard.env.backends.base import ExecSpec, SandboxSpec
from orchard.env.runner import free_port, terminate
from orchard.env.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "docker" / "bundle-python.sh"
TOKEN = "token-for-the-test"


def _usable() -> str:
    missing = [t for t in ("patchelf", "bwrap", "ldd") if shutil.which(t) is None]
    if missing:
        return f"needs {', '.join(missing)} (make install brings them)"
    if subprocess.run(["bwrap", "--ro-bind", "/", "/", "true"], capture_output=True).returncode != 0:
        return "bubblewrap cannot make a namespace here"
    return ""


pytestmark = pytest.mark.skipif(bool(_usable()), reason=_usable() or "usable")


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    """The agent image's /opt/orchard-agent, made as agent.Dockerfile makes it."""
    home = tmp_path_factory.mktemp("agent-image")
    python = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    subprocess.run(["sh", str(SCRIPT), python, str(home / "python"), str(Path(agent.PYTHON).parent.parent)],
                   check=True, capture_output=True)
    shutil.copytree(ROOT / "src" / "orchard" / "env" / "agent", Path(home, agent.LIB[len(agent.HOME) + 1:], agent.PACKAGE),
                    ignore=shutil.ignore_patterns("__pycache__"))
    return home


def bwrap(binds: list[tuple[Path, str, bool]], command: list[str], env: dict[str, str]) -> list[str]:
    """A bubblewrap command line: an empty root with only these binds (source, target, read-only)."""
    args = ["bwrap", "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--clearenv",
            "--dir", "/tmp", "--proc", "/proc", "--dev", "/dev"]
    for source, target, read_only in binds:
        args += ["--ro-bind" if read_only else "--bind", str(source), target]
    for name, value in env.items():
        args += ["--setenv", name, value]
    return args + ["--", *command]


def test_the_bundled_interpreter_needs_nothing_from_the_image(image):
    code = "import sys, ssl, json, ctypes, hashlib, socket, subprocess, pty, select; print(sys.prefix)"
    result = subprocess.run(bwrap([(image, agent.HOME, True)], [agent.PYTHON, "-I", "-c", code], {}),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(Path(agent.PYTHON).parent.parent)


def test_the_image_alone_does_not_run_without_the_bundle(image):
    """The empty root really is empty: a host program cannot start in it."""
    result = subprocess.run(bwrap([(image, agent.HOME, True)], [shutil.which("true") or "/bin/true"], {}),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0


def _mounts(container: dict, volumes: dict[str, Path]) -> list[tuple[Path, str, bool]]:
    return [(volumes[m["name"]], m["mountPath"], bool(m.get("readOnly"))) for m in container["volumeMounts"]]


def test_the_pod_installs_and_serves_the_agent_in_an_image_with_nothing(image, tmp_path):
    port = free_port()
    pod = kubernetes_pods.sandbox_pod(Settings(kube_agent_port=port), SandboxSpec("sbx1", "scratch"), "scratch")
    volumes = {v["name"]: tmp_path / v["name"] for v in pod["spec"]["volumes"]}
    for folder in volumes.values():
        folder.mkdir()
    [install] = pod["spec"]["initContainers"]
    init_env = {install["env"][0]["name"]: TOKEN}
    done = subprocess.run(bwrap([(image, agent.HOME, True), *_mounts(install, volumes)], install["command"], init_env),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    [sandbox] = pod["spec"]["containers"]
    env = {e["name"]: e["value"] for e in sandbox["env"]}
    proc = subprocess.Popen(bwrap(_mounts(sandbox, volumes), sandbox["command"], env),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(proc, port)
        outcome = asyncio.run(_exec_through_the_backend_client(port, [agent.PYTHON, "-c", "print(6 * 7)"]))
        assert (outcome.exit_code, outcome.stdout) == (0, b"42\n")
        assert not (volumes[kubernetes_pods.TOKEN_VOLUME] / "token").exists(), "the agent leaves no token file behind"
    finally:
        terminate(proc, timeout=10)


def _wait_healthy(proc: subprocess.Popen, port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the agent exited: {proc.stdout.read().decode(errors='replace')}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}{agent.HEALTH}", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError("the agent did not answer its health check")


async def _exec_through_the_backend_client(port: int, argv: list[str]):
    from orchard.env.backends.kubernetes_agent_client import Agent, AgentClient

    client = AgentClient(pool=2)
    try:
        target = Agent("sbx1", "127.0.0.1", port, TOKEN)
        info = await client.info(target)
        assert info["workdir"]
        return await client.exec(target, ExecSpec(argv=argv, timeout=30), info["workdir"], {})
    finally:
        await client.close()
