"""The pod informer and the API-server side of the Kubernetes backend, against the fake API server in-process.

No kubelet here: the tests write pod status themselves, as a kubelet would, and check that
waiters wake on those events, that failures carry their reason, that an expired watch re-lists,
and that listing failures make list_live answer None.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from kubernetes import client as kube

from orchard import errors
from orchard.env.backends import kubernetes_informer as informer_mod
from orchard.env.backends import kubernetes_pods as pods
from orchard.env.backends.base import SandboxSpec
from orchard.env.backends.kubernetes import KubernetesBackend
from orchard.env.backends.kubernetes_informer import Informer, failure_of
from orchard.env.runner import free_port
from orchard.env.settings import Settings
from tests.env.kube_fake import kubeconfig
from tests.env.kube_fake.api import FakeApiServer, Store

NS = "orchard-sandboxes"


class Api:
    """The fake API server on a thread, without a kubelet."""

    def __init__(self):
        self.store = Store([NS])
        self.server = FakeApiServer(("127.0.0.1", free_port()), self.store, [])
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def core(self) -> kube.CoreV1Api:
        return kube.CoreV1Api(kube.ApiClient(kube.Configuration(host=self.url)))

    def stop(self) -> None:
        if not self.server.stopping.is_set():
            self.server.stop()


@pytest.fixture
def api():
    a = Api()
    yield a
    a.stop()


def settings(tmp_path, api: Api) -> Settings:
    (tmp_path / "kubeconfig").write_text(kubeconfig(api.url))
    return Settings(backend="kubernetes", state_dir=tmp_path, kube_config=tmp_path / "kubeconfig")


def add_pod(api: Api, sid: str) -> None:
    s = Settings()
    code, _ = api.store.create("pods", NS, pods.sandbox_pod(s, SandboxSpec(sid, "img", created_at=time.time()), "img"))
    assert code == 201


def set_status(api: Api, sid: str, **status) -> None:
    def change(pod: dict) -> None:
        pod["status"].update(status)
    api.store.update("pods", NS, pods.pod_name(sid), change)


READY = {"phase": "Running", "podIP": "10.1.2.3", "conditions": [{"type": "Ready", "status": "True"}]}


async def test_events_wake_waiters_without_polling(api):
    informer = Informer(api.core(), NS, "app.kubernetes.io/managed-by=orchard", 7070)
    await informer.start()
    try:
        add_pod(api, "a")
        waiter = asyncio.create_task(informer.wait("a", lambda s: s is not None and s.serving, timeout=30))
        await asyncio.sleep(0.3)
        assert not waiter.done()
        set_status(api, "a", **READY)
        state = await waiter
        assert (state.ip, state.port, state.phase) == ("10.1.2.3", 7070, "Running")
        assert [c for c in api.store.calls if c[0] == "list"] == [("list", "pods", "")], "one LIST, then the watch"
    finally:
        informer.close()


async def test_image_pull_failure_carries_the_reason(api):
    informer = Informer(api.core(), NS, "", 7070)
    await informer.start()
    try:
        add_pod(api, "b")
        waiter = asyncio.create_task(informer.wait("b", lambda s: s is not None and s.failure is not None, timeout=30))
        set_status(api, "b", containerStatuses=[{"name": "sandbox", "image": "x", "imageID": "", "restartCount": 0,
                                                 "ready": False, "state": {"waiting": {
                                                     "reason": "ImagePullBackOff", "message": "back-off pulling"}}}])
        state = await waiter
        assert "ImagePullBackOff" in state.failure and "back-off pulling" in state.failure
    finally:
        informer.close()


def test_failure_reasons():
    def waiting(reason):
        return {"containerStatuses": [{"name": "sandbox", "state": {"waiting": {"reason": reason, "message": "m"}}}]}
    assert failure_of(waiting("ContainerCreating")) is None           # still starting: not a failure
    for reason in ("ErrImagePull", "InvalidImageName", "CreateContainerConfigError"):
        assert reason in failure_of(waiting(reason))
    oom = {"containerStatuses": [{"name": "sandbox", "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}
    assert "OOMKilled" in failure_of(oom)
    init_ok = {"initContainerStatuses": [{"name": "i", "state": {"terminated": {"reason": "Completed", "exitCode": 0}}}]}
    assert failure_of(init_ok) is None
    assert "phase Failed" in failure_of({"phase": "Failed", "reason": "Evicted"})


async def test_expired_watch_relists(api, monkeypatch):
    monkeypatch.setattr(informer_mod, "WATCH_SECONDS", 1)
    informer = Informer(api.core(), NS, "", 7070)
    await informer.start()
    try:
        api.store.create("secrets", NS, {"metadata": {"name": "unwatched"}})   # a version the pod watch never sees
        api.store.compact()          # so the re-opened watch asks for a version the server forgot: 410 Gone
        deadline = time.monotonic() + 30
        while len([c for c in api.store.calls if c[0] == "list"]) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert len([c for c in api.store.calls if c[0] == "list"]) >= 2, "no re-list after 410 Gone"
        add_pod(api, "c")
        state = await informer.wait("c", lambda s: s is not None, timeout=30)
        assert state.sandbox_id == "c"
    finally:
        informer.close()


async def test_list_live_is_none_when_the_api_server_is_gone(tmp_path, api):
    backend = KubernetesBackend(settings(tmp_path, api))
    await backend.start(_ignore)
    try:
        add_pod(api, "d")
        live = await backend.list_live()
        assert [(x.sandbox_id, x.alive) for x in live] == [("d", True)]
        api.stop()
        assert await backend.list_live() is None
    finally:
        await backend.close()


async def test_start_makes_shared_policies_once(tmp_path, api):
    for _ in range(2):
        backend = KubernetesBackend(settings(tmp_path, api))
        await backend.start(_ignore)
        await backend.close()
    names = sorted(name for (kind, _, name) in api.store.objects if kind == "networkpolicies")
    assert names == [pods.AGENT_INGRESS, pods.DENY_EGRESS]


async def test_start_fails_clearly_without_namespace(tmp_path, api):
    api.store.namespaces.clear()
    backend = KubernetesBackend(settings(tmp_path, api))
    with pytest.raises(errors.BackendError, match="does not exist"):
        await backend.start(_ignore)


async def _ignore(sandbox_id: str, message: str) -> None:
    return None
