"""A fake Kubernetes API server with a fake kubelet, for testing the Kubernetes backend where no cluster exists.

``api.py`` is the REST subset (pods, Secrets, NetworkPolicies, namespaces, nodes; label selectors,
resourceVersions, watch streams); ``kubelet.py`` runs each pod's containers as local bubblewrap
processes and writes their status; ``network.py`` gives closed pods a network namespace of their own
and emulates what their NetworkPolicies let through. ``FakeCluster`` starts both in a child process and writes a
kubeconfig for them; the in-process ``Store``/``FakeApiServer`` serve unit tests.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from orchard.env.runner import free_port

ROOT = Path(__file__).resolve().parents[3]


def skip_without_bwrap() -> None:
    """The fake kubelet runs pods with bubblewrap: without it, tests that need pods are skipped, saying so."""
    import shutil

    import pytest
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (make install): the fake kubelet runs pods with it")


def kubeconfig(url: str) -> str:
    return (f"apiVersion: v1\nkind: Config\ncurrent-context: fake\nclusters:\n- name: fake\n  cluster:\n"
            f"    server: {url}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n"
            f"users:\n- name: fake\n  user: {{}}\n")


class FakeCluster:
    """`python -m tests.env.kube_fake` in a child process, and a kubeconfig that points at it."""

    def __init__(self, root: Path, namespaces: tuple[str, ...] = ("orchard-sandboxes",)):
        self.root, self.namespaces = root, namespaces
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.kubeconfig = root / "kubeconfig"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "FakeCluster":
        self.root.mkdir(parents=True, exist_ok=True)
        self.kubeconfig.write_text(kubeconfig(self.url))
        argv = [sys.executable, "-m", "tests.env.kube_fake", "--port", str(self.port), "--root", str(self.root)]
        for ns in self.namespaces:
            argv += ["--namespace", ns]
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL,
                                     stderr=open(self.root / "fake.log", "ab"))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{self.url}/api/v1/nodes", timeout=1)
                return self
            except httpx.HTTPError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the fake API server exited: {(self.root / 'fake.log').read_text()[-2000:]}")
                time.sleep(0.1)
        raise RuntimeError("the fake API server did not answer within 30s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
