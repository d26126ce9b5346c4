"""Build both images with real Podman and run them as a cluster would (slow: builds pull from PyPI and Debian).

There is no registry here, so python:3.11-slim-bookworm is stood in for by an image made from this machine's
own Debian 12 packages (python3.11 as /usr/local/bin/python3.11, pip, venv, apt, patchelf, binutils); each
Dockerfile is built unchanged but for its FROM python:... lines, which name the stand-in. Then:
- the agent image's entrypoint installs the agent into a folder (the pod's shared volume), and a static
  busybox image with no libc and no Python runs the agent from that folder, with no capabilities;
- the service image, read-only and without capabilities, runs with the environment the Helm chart renders,
  against the fake Kubernetes API server (tests/env/kube_fake, whose kubelet gives a pod that no open egress
  policy selects a network namespace of its own) and a password-protected redis-server, and scripts/smoke.py
  passes every check against it.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import httpx
import pytest

from orchard.env import agent, podman
from orchard.env.backends import kubernetes_pods
from orchard.env.backends.base import ExecSpec, SandboxSpec
from orchard.env.runner import free_port
from orchard.env.settings import Settings
from tests.deploy.conftest import container_env, one, render

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"
STANDIN = "localhost/orchard-test-python:3.11-slim-bookworm"
PACKAGES = ("patchelf", "binutils", "apt", "dpkg", "python3.11", "python3-pip", "python3.11-venv", "passwd")
PASSWORD, KEY = "RedisPw1", "smoke-key"


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """podman ARGS with the project's containers.conf."""
    return podman.podman(*args, timeout=timeout)


def build(*args: str, timeout: float = 900) -> None:
    done = run("build", "--pull=never", "--layers=false", *args, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    from orchard.env.backends import container_images as images

    if not podman.available():
        pytest.skip("podman is not available")
    installed = images._installed()
    missing = [p for p in PACKAGES if p not in installed]
    if missing:
        pytest.skip(f"the stand-in base needs these Debian packages installed here: {', '.join(missing)}")
    folder = tmp_path_factory.mktemp("standin")
    with tarfile.open(folder / "rootfs.tar", "w") as tar:
        images._write_rootfs(tar, images._files(sorted(images._closure(images.HOST_PACKAGES + PACKAGES, installed))))
    assert run("import", str(folder / "rootfs.tar"), STANDIN + "-base").returncode == 0
    (folder / "Containerfile").write_text(
        f"FROM {STANDIN}-base\nENV PIP_BREAK_SYSTEM_PACKAGES=1\n"
        "RUN mkdir -p /usr/local/bin /usr/local/lib && ln -s /usr/bin/python3.11 /usr/local/bin/python3.11\n")
    build("-f", str(folder / "Containerfile"), "-t", STANDIN, str(folder))
    yield folder
    run("rmi", "-f", STANDIN, STANDIN + "-base")


def build_image(standin: Path, name: str, tag: str) -> str:
    text = re.sub(r"^FROM python:3\.11-slim-bookworm", f"FROM {STANDIN}", (DOCKER / name).read_text(), flags=re.M)
    dockerfile = standin / name
    dockerfile.write_text(text)
    build("--ignorefile", str(DOCKER / f"{name}.dockerignore"), "-f", str(dockerfile), "-t", tag, str(ROOT))
    return tag


@pytest.fixture(scope="module")
def agent_image(standin):
    yield build_image(standin, "agent.Dockerfile", "localhost/orchard-test-agent:latest")
    run("rmi", "-f", "localhost/orchard-test-agent:latest")


@pytest.fixture(scope="module")
def service_image(standin):
    yield build_image(standin, "service.Dockerfile", "localhost/orchard-test-service:latest")
    run("rmi", "-f", "localhost/orchard-test-service:latest")


def test_the_agent_image_serves_in_a_busybox_container(agent_image, tmp_path):
    busybox = podman.ensure_busybox_image()
    if busybox is None:
        pytest.skip("no busybox image could be made here")
    port = free_port()
    pod = kubernetes_pods.sandbox_pod(Settings(kube_agent_port=port), SandboxSpec("sbx1", busybox), busybox)
    [install], [sandbox] = pod["spec"]["initContainers"], pod["spec"]["containers"]
    volumes = {v["name"]: tmp_path / v["name"] for v in pod["spec"]["volumes"]}
    for folder in volumes.values():
        folder.mkdir()
    hardened = ["--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
    done = run("run", "--rm", *hardened, *_volumes(install, volumes), "-e", f"{agent.TOKEN_ENV}=tok",
               f"--entrypoint={json.dumps(install['command'])}", agent_image)
    assert done.returncode == 0, done.stderr
    name = f"orchard-test-agent-{port}"
    env = [f"--env={e['name']}={e['value']}" for e in sandbox["env"]]
    started = run("run", "-d", "--name", name, "--network", "host", *hardened, *_volumes(sandbox, volumes), *env,
                  f"--entrypoint={json.dumps(sandbox['command'])}", busybox)
    assert started.returncode == 0, started.stderr
    try:
        _wait(f"http://127.0.0.1:{port}{agent.HEALTH}", lambda: run("logs", name).stderr)
        outcome = asyncio.run(_exec(port, "tok", ["busybox", "sh", "-c", "echo hi; id -u"]))
        assert (outcome.exit_code, outcome.stdout) == (0, b"hi\n0\n")
    finally:
        run("rm", "-f", "-t", "2", name)


def _volumes(container: dict, volumes: dict[str, Path]) -> list[str]:
    return [f"--volume={volumes[m['name']]}:{m['mountPath']}{':ro' if m.get('readOnly') else ''}"
            for m in container["volumeMounts"]]


async def _exec(port: int, token: str, argv: list[str]):
    from orchard.env.backends.kubernetes_agent_client import Agent, AgentClient

    client = AgentClient(pool=2)
    try:
        return await client.exec(Agent("sbx1", "127.0.0.1", port, token), ExecSpec(argv=argv, timeout=30), "/", {})
    finally:
        await client.close()


def _wait(url: str, logs, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.3)
    raise AssertionError(f"{url} did not answer: {logs()[-3000:]}")


@pytest.fixture
def backing(tmp_path):
    """The fake API server and a redis-server with a password, as the cluster and the chart's Redis."""
    import redis

    from tests.env.kube_fake import FakeCluster, skip_without_bwrap
    from tests.env.redis_server import RedisServer, need_redis

    need_redis()
    skip_without_bwrap()
    cluster = FakeCluster(tmp_path / "kube").start()
    store = RedisServer(tmp_path / "redis").start()
    redis.Redis(port=store.port).config_set("requirepass", PASSWORD)
    yield cluster, store
    store.kill()
    cluster.stop()


def chart_container(port: int, redis_port: int) -> tuple[dict[str, str], list[str]]:
    """The service container's environment (Secrets filled in, pointed at the fakes) and args, as the chart renders them."""
    filled = {"ORCHARD_REPLICA_ID": "orchard-0", "ORCHARD_API_KEYS": KEY, "ORCHARD_ADMIN_KEYS": "",
              "REDIS_PASSWORD": PASSWORD}
    deployment = one(render({"apiKeys": {"keys": [KEY]}, "redis": {"password": PASSWORD}}), "Deployment")
    env = {name: entry.get("value", filled.get(name)) for name, entry in container_env(deployment).items()}
    assert env["ORCHARD_REDIS_URL"].startswith("redis://:$(REDIS_PASSWORD)@")
    env.update(ORCHARD_REDIS_URL=f"redis://:{PASSWORD}@127.0.0.1:{redis_port}/0", ORCHARD_PORT=str(port),
               ORCHARD_KUBE_CONFIG="/etc/orchard/kubeconfig")
    return env, deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def test_the_service_image_runs_the_chart_environment_and_passes_the_smoke_test(service_image, backing):
    cluster, store = backing
    port = free_port()
    name = f"orchard-test-service-{port}"
    environment, args = chart_container(port, store.port)
    env = [f"--env={k}={v}" for k, v in environment.items()]
    started = run("run", "-d", "--name", name, "--network", "host", "--read-only", "--cap-drop", "ALL",
                  "--security-opt", "no-new-privileges", "--tmpfs", "/tmp", "--tmpfs", "/var/lib/orchard:mode=1777",
                  f"--volume={cluster.kubeconfig}:/etc/orchard/kubeconfig:ro", *env, service_image, *args)
    assert started.returncode == 0, started.stderr
    try:
        _wait(f"http://127.0.0.1:{port}/health", lambda: run("logs", name).stderr)
        assert run("exec", name, "id", "-u").stdout.strip() == "10001"
        smoke = subprocess.run([sys.executable, str(ROOT / "scripts" / "smoke.py"), "--url", f"http://127.0.0.1:{port}",
                                "--api-key", KEY, "--probe", f"127.0.0.1:{store.port}"],
                               capture_output=True, text=True, timeout=600)
        for check in ("health", "create", "exec", "exec exit code", "files round trip", "block_network", "delete"):
            assert f"PASS {check} " in smoke.stdout, smoke.stdout + run("logs", name).stderr[-3000:]
        assert smoke.returncode == 0
    finally:
        run("rm", "-f", "-t", "3", name)
