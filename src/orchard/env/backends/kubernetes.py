"""The Kubernetes backend: one pod per sandbox in a shared namespace; exec, files and PTY through the in-pod agent.

The API server is used for create, delete, list (reconcile) and one pod watch (kubernetes_informer:
the cache of phase, IP and failure reasons that wakes readiness waits). A sandbox is a token Secret,
a pod, only when ``block_network`` is false an egress NetworkPolicy of its own, and only with a
``model_endpoint`` a second one allowing exactly the target's addresses and port (the in-pod agent
relays 127.0.0.1:port there; the target's name is resolved here, at create); the namespace-wide
default-deny-egress and agent-ingress policies are created at start when missing.
Everything else goes straight to the agent over the pod IP with the sandbox's token
(kubernetes_agent_client). The pod spec is in kubernetes_pods.

Several replicas share one store: a replica asked about a sandbox another one created attaches to it on
first use (the pod from its own watch, the token from the sandbox's Secret: one read per sandbox and
replica, shared by concurrent first uses) and forgets the handle when its watch reports the pod gone.

This backend has been run only against the fake API server of tests/env/kube_fake, never a real cluster.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import logging
import secrets
import socket
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Optional

import urllib3
from kubernetes import client as kube
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from orchard import errors
from orchard.env.backends import kubernetes_pods as pods
from orchard.env.backends.base import ExecOutcome, ExecSpec, ExitCallback, LiveSandbox, PtyProcess, SandboxSpec
from orchard.env.backends.kubernetes_agent_client import Agent, AgentClient
from orchard.env.backends.kubernetes_informer import Informer, PodState
from orchard.env.backends.single_flight import SingleFlight
from orchard.env.protocol import FileEntry
from orchard.env.quantities import parse_cpu, parse_memory
from orchard.env.settings import Settings

log = logging.getLogger("orchard.env")
DEFAULT_WORKDIR = "/workspace"
ATTACH_WAIT = 5.0       # seconds a replica waits for its own watch to see a sandbox serve whose Secret it found
API_ERRORS = (ApiException, urllib3.exceptions.HTTPError, OSError)


@dataclass
class Box:
    """A ready sandbox: its agent and what the agent said of the image."""

    agent: Agent
    workdir: str
    has_bash: bool
    networked: bool = True        # unknown after a restart: then delete also tries the egress policy
    model: bool = True            # ...and the model-endpoint policy


class KubernetesBackend:
    """Sandboxes as pods of one namespace."""

    name = "kubernetes"

    def __init__(self, settings: Settings):
        self.settings = settings
        self.namespace = settings.namespace
        self.core: Optional[kube.CoreV1Api] = None
        self.networking: Optional[kube.NetworkingV1Api] = None
        self.informer: Optional[Informer] = None
        self.agents: Optional[AgentClient] = None
        self._api: Optional[kube.ApiClient] = None
        self._boxes: dict[str, Box] = {}
        self._deleting: set[str] = set()
        self._attaching: SingleFlight[Box] = SingleFlight()
        self._on_exit: Optional[ExitCallback] = None
        self._tasks: set[asyncio.Task] = set()
        self._capacity = (parse_cpu(settings.default_cpu) * settings.max_sandboxes,
                          parse_memory(settings.default_memory) * settings.max_sandboxes)
        # API calls block (the official client is synchronous): their own threads, one per concurrent create
        # and a few for deletes and listings, so they never queue behind other blocking work of the service
        self._threads = ThreadPoolExecutor(max_workers=settings.create_concurrency + 8, thread_name_prefix="orchard-kube")

    async def _blocking(self, call, *args):
        return await asyncio.get_running_loop().run_in_executor(self._threads, functools.partial(call, *args))

    # ------------------------------------------------------------ service lifetime
    async def start(self, on_exit: ExitCallback) -> None:
        if self.settings.tools_dir is not None:
            raise errors.BackendError("tools_dir cannot be mounted into Kubernetes pods (a host directory of the "
                                      "service): bake the tools into the sandbox images and unset ORCHARD_TOOLS_DIR")
        self._on_exit = on_exit
        try:
            self._api = await self._blocking(self._connect)
            self.core, self.networking = kube.CoreV1Api(self._api), kube.NetworkingV1Api(self._api)
            await self._blocking(self._prepare_namespace)
            self.informer = Informer(self.core, self.settings.kube_namespace, pods.selector(self.settings),
                                     self.settings.kube_agent_port)
            self.informer.on_change(self._pod_changed)
            await self.informer.start()
        except (ConfigException, *API_ERRORS) as e:
            raise errors.BackendError(f"Cannot use the Kubernetes API for namespace "
                                      f"{self.settings.kube_namespace!r}: {_why(e)}") from e
        self._capacity = await self._blocking(self._node_capacity) or self._capacity
        self.agents = AgentClient(self.settings.kube_agent_pool)

    def _connect(self) -> kube.ApiClient:
        """The kubeconfig named by settings, else the in-cluster service account, else ~/.kube/config."""
        cfg = kube.Configuration()
        if self.settings.kube_config:
            kube_config.load_kube_config(config_file=str(self.settings.kube_config), client_configuration=cfg)
        else:
            try:
                kube_config.load_incluster_config(client_configuration=cfg)
            except ConfigException:
                kube_config.load_kube_config(client_configuration=cfg)
        cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize, self.settings.create_concurrency + 8)
        return kube.ApiClient(cfg)

    def _prepare_namespace(self) -> None:
        """The namespace must exist; its two shared NetworkPolicies are made when missing (idempotent)."""
        try:
            self.core.read_namespace(self.settings.kube_namespace)
        except ApiException as e:
            if e.status == 404:
                raise errors.BackendError(f"Namespace {self.settings.kube_namespace!r} does not exist "
                                          "(the deployment manifests create it)") from e
            if e.status != 403:          # a Role without namespace reads: the creates below still tell
                raise
        for policy in (pods.default_deny_egress(self.settings), pods.agent_ingress(self.settings)):
            _create_quietly(self.networking.create_namespaced_network_policy, self.settings.kube_namespace, policy)

    def _node_capacity(self) -> Optional[tuple[float, int]]:
        """Allocatable CPU and memory of the schedulable nodes (None without RBAC to list nodes)."""
        try:
            nodes = self.core.list_node(_request_timeout=10).items
        except API_ERRORS as e:
            log.info("node capacity unknown (%s): reporting max_sandboxes x the default limits", _why(e))
            return None
        usable = [n.status.allocatable or {} for n in nodes if not (n.spec and n.spec.unschedulable)]
        try:
            cpu = sum(parse_cpu(a.get("cpu", "0")) for a in usable)
            mem = sum(parse_memory(a.get("memory", "0")) for a in usable)
        except (ValueError, errors.OrchardError) as e:
            log.info("node capacity unreadable (%s): reporting max_sandboxes x the default limits", e)
            return None
        return (cpu, mem) if cpu > 0 and mem > 0 else None

    async def close(self) -> None:
        self._attaching.cancel()
        if self.informer is not None:
            self.informer.close()
        if self.agents is not None:
            await self.agents.close()
        if self._api is not None:
            await self._blocking(self._api.close)
        self._threads.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------ create
    async def create(self, spec: SandboxSpec) -> None:
        image = self._image(spec)
        token = secrets.token_urlsafe(32)
        addresses = await self._blocking(_resolve, spec.model_endpoint) if spec.model_endpoint else []
        try:
            await self._blocking(self._create_objects, spec, image, token, addresses)
            state = await self._until_settled(spec.sandbox_id)
            if state is None or state.failure:
                why = state.failure if state else "the pod was deleted while starting"
                raise errors.SandboxFailedError(self._failed(spec.image, why))
            self._boxes[spec.sandbox_id] = await self._box(spec.sandbox_id, state, token, *_kinds(spec))
        except BaseException:
            await asyncio.shield(self.delete(spec.sandbox_id))
            raise

    def _image(self, spec: SandboxSpec) -> str:
        if spec.model_endpoint is not None and spec.model_endpoint[0] == self.settings.kube_agent_port:
            raise errors.SandboxFailedError(f"model_endpoint port {spec.model_endpoint[0]} is the in-pod agent's "
                                            "port (ORCHARD_KUBE_AGENT_PORT): choose another")
        if spec.image.startswith("@"):
            raise errors.SandboxFailedError("Snapshots are not available on the Kubernetes backend")
        return self.settings.kube_host_image if spec.image == "host" else spec.image

    def _failed(self, image: str, why: str) -> str:
        if any(r in why for r in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")):
            return (f"Image {image!r} cannot be started: {why}. Available: host (= {self.settings.kube_host_image}) "
                    "or any image the cluster's nodes can pull")
        return f"Sandbox failed to start: {why}"

    def _create_objects(self, spec: SandboxSpec, image: str, token: str, addresses: list[str]) -> None:
        """Secret first (the pod's init container reads it), then the egress policies, then the pod."""
        ns = self.settings.kube_namespace
        try:
            self.core.create_namespaced_secret(ns, pods.token_secret(self.settings, spec, token))
            if not spec.block_network:
                self.networking.create_namespaced_network_policy(ns, pods.sandbox_egress(self.settings, spec))
            if addresses:
                self.networking.create_namespaced_network_policy(ns, pods.model_egress(self.settings, spec, addresses))
            self.core.create_namespaced_pod(ns, pods.sandbox_pod(self.settings, spec, image, addresses))
        except ApiException as e:
            if e.status == 409:
                raise errors.ConflictError(f"Sandbox {spec.sandbox_id} already exists in the cluster") from e
            raise errors.SandboxFailedError(f"The Kubernetes API refused the sandbox: {_why(e)}") from e
        except API_ERRORS as e:
            raise errors.SandboxFailedError(f"The Kubernetes API cannot be reached: {_why(e)}") from e

    async def _until_settled(self, sandbox_id: str) -> Optional[PodState]:
        """The pod's state once it serves or failed (None: it vanished), woken by watch events only."""
        seen = False

        def settled(state: Optional[PodState]) -> bool:
            nonlocal seen
            if state is None:
                return seen
            seen = True
            return state.serving or state.failure is not None

        return await self.informer.wait(sandbox_id, settled)

    async def _box(self, sandbox_id: str, state: PodState, token: str, networked: bool, model: bool) -> Box:
        target = Agent(sandbox_id, state.ip, state.port, token)
        try:
            info = await self.agents.info(target)
        except errors.OrchardError as e:
            raise errors.SandboxFailedError(f"The sandbox's agent does not answer: {e.detail}") from e
        return Box(target, info.get("workdir") or DEFAULT_WORKDIR, bool(info.get("has_bash", True)),
                   networked=networked, model=model)

    def _pod_changed(self, old: Optional[PodState], new: PodState) -> None:
        """A ready sandbox whose pod failed or vanished is forgotten and reported to the service, once per replica."""
        sid = new.sandbox_id
        if not (new.deleted or new.failure):
            return
        box = self._boxes.pop(sid, None)
        if sid in self._deleting or box is None:
            return
        if self._on_exit is not None:
            task = asyncio.get_running_loop().create_task(
                self._on_exit(sid, new.failure or "The sandbox's pod was deleted"))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def adopt(self, spec: SandboxSpec) -> bool:
        state = self.informer.states.get(spec.sandbox_id) if self.informer else None
        if state is None or not state.serving:
            return False
        try:
            token = await self._blocking(self._read_token, spec.sandbox_id)
            self._boxes[spec.sandbox_id] = await self._box(spec.sandbox_id, state, token, *_kinds(spec))
        except (errors.OrchardError, *API_ERRORS) as e:
            log.warning("adopting %s failed: %s", spec.sandbox_id, _why(e))
            return False
        return True

    async def _ready(self, sandbox_id: str) -> Box:
        """This replica's handle of a serving sandbox; one another replica created is attached on first use."""
        box = self._boxes.get(sandbox_id)
        if box is not None:
            return box
        return await self._attaching.run(sandbox_id, self._attach)     # concurrent first uses share one lookup

    async def _attach(self, sandbox_id: str) -> Box:
        """Handle of a sandbox this replica did not create: its token Secret, then its pod as the watch shows it."""
        state = self.informer.states.get(sandbox_id) if self.informer else None
        if sandbox_id in self._deleting or (state is not None and state.failure is not None):
            raise errors.SandboxNotFoundError(f"Sandbox {sandbox_id} is not running in the cluster")
        token = await self._token(sandbox_id)          # no Secret: no such sandbox, without waiting for the watch
        state = await self._serving(sandbox_id)
        try:                                           # which policies it has is unknown here: delete tries both
            box = await self._box(sandbox_id, state, token, networked=True, model=True)
        except errors.SandboxFailedError as e:
            if self._still_serving(sandbox_id):
                raise errors.BackendError(e.detail) from e
            raise errors.SandboxNotFoundError(f"Sandbox {sandbox_id} is gone: {e.detail}") from e
        if not self._still_serving(sandbox_id):
            raise errors.SandboxNotFoundError(f"Sandbox {sandbox_id} is not running in the cluster")
        return self._boxes.setdefault(sandbox_id, box)

    async def _token(self, sandbox_id: str) -> str:
        try:
            return await self._blocking(self._read_token, sandbox_id)
        except ApiException as e:
            if e.status == 404:
                raise errors.SandboxNotFoundError(f"Sandbox {sandbox_id} is not running in the cluster") from e
            raise errors.BackendError(f"Reading the token of sandbox {sandbox_id} failed: {_why(e)}") from e
        except (KeyError, TypeError, ValueError, *API_ERRORS) as e:
            raise errors.BackendError(f"Reading the token of sandbox {sandbox_id} failed: {_why(e)}") from e

    def _still_serving(self, sandbox_id: str) -> bool:
        state = self.informer.states.get(sandbox_id)
        return sandbox_id not in self._deleting and state is not None and state.serving

    async def _serving(self, sandbox_id: str) -> PodState:
        """The pod's state once this replica's watch shows it serving (it may lag the replica that created it)."""
        def settled(state: Optional[PodState]) -> bool:
            return state is not None and (state.serving or state.failure is not None or state.deleted)

        not_running = errors.SandboxNotFoundError(f"Sandbox {sandbox_id} is not running in the cluster")
        try:
            state = await self.informer.wait(sandbox_id, settled, timeout=ATTACH_WAIT)
        except asyncio.TimeoutError:
            raise not_running from None
        if not state.serving:
            raise not_running
        return state

    def _read_token(self, sandbox_id: str) -> str:
        secret = self.core.read_namespaced_secret(pods.secret_name(sandbox_id), self.settings.kube_namespace)
        return base64.b64decode(secret.data["token"]).decode()

    # ------------------------------------------------------------ delete and list
    async def delete(self, sandbox_id: str) -> None:
        self._deleting.add(sandbox_id)
        try:
            box = self._boxes.pop(sandbox_id, None)
            await self._blocking(self._remove, sandbox_id, box)
        finally:
            self._deleting.discard(sandbox_id)

    def _remove(self, sandbox_id: str, box: Optional[Box]) -> None:
        """Pod, Secret and (when there may be some: always for an unknown box) policies; what is gone is fine."""
        ns, grace = self.settings.kube_namespace, pods.GRACE_SECONDS
        calls = [(self.core.delete_namespaced_pod, pods.pod_name(sandbox_id), {"grace_period_seconds": grace}),
                 (self.core.delete_namespaced_secret, pods.secret_name(sandbox_id), {})]
        policy = self.networking.delete_namespaced_network_policy
        if box is None or box.networked:
            calls.append((policy, pods.egress_name(sandbox_id), {}))
        if box is None or box.model:
            calls.append((policy, pods.model_name(sandbox_id), {}))
        for call, name, extra in calls:
            try:
                call(name, ns, **extra)
            except ApiException as e:
                if e.status != 404:
                    raise errors.BackendError(f"Deleting {name} failed: {_why(e)}") from e
            except API_ERRORS as e:
                raise errors.BackendError(f"The Kubernetes API cannot be reached: {_why(e)}") from e

    async def list_live(self) -> Optional[list[LiveSandbox]]:
        """Pods, and leftover Secrets and policies (as dead sandboxes), by label; None when the API cannot list."""
        try:
            return await self._blocking(self._list_live)
        except API_ERRORS as e:
            log.warning("listing sandboxes failed: %s", _why(e))
            return None

    def _list_live(self) -> list[LiveSandbox]:
        ns, sel = self.settings.kube_namespace, pods.selector(self.settings)
        found: dict[str, LiveSandbox] = {}
        for pod in self.core.list_namespaced_pod(ns, label_selector=sel).items:
            sid = (pod.metadata.labels or {}).get(pods.SANDBOX_LABEL)
            if sid:
                alive = pod.status.phase in ("Pending", "Running") and not pod.metadata.deletion_timestamp
                found[sid] = LiveSandbox(sid, _created(pod.metadata), alive=alive)
        leftovers = (self.core.list_namespaced_secret(ns, label_selector=sel).items
                     + self.networking.list_namespaced_network_policy(ns, label_selector=sel).items)
        for obj in leftovers:
            sid = (obj.metadata.labels or {}).get(pods.SANDBOX_LABEL)
            if sid and sid not in found:
                found[sid] = LiveSandbox(sid, _created(obj.metadata), alive=False)
        return list(found.values())

    # ------------------------------------------------------------ exec, PTY, files
    @staticmethod
    def _argv(box: Box, argv: list[str]) -> list[str]:
        if argv and argv[0] == "bash" and not box.has_bash:
            return ["sh"] + ["-l" if arg == "--login" else arg for arg in argv[1:]]
        return argv

    async def _agent(self, sandbox_id: str, call):
        """An agent call; when the agent cannot be reached because its pod is gone, the sandbox is not found."""
        try:
            return await call
        except errors.BackendError as e:
            state = self.informer.states.get(sandbox_id) if self.informer else None
            if state is None or not state.serving:
                raise errors.SandboxNotFoundError(f"Sandbox {sandbox_id} is gone: {e.detail}") from e
            raise

    async def exec(self, sandbox_id: str, spec: ExecSpec) -> ExecOutcome:
        box = await self._ready(sandbox_id)
        argv = self._argv(box, spec.argv)
        return await self._agent(sandbox_id, self.agents.exec(box.agent, replace(spec, argv=argv),
                                                              spec.cwd or box.workdir, spec.env))

    async def open_pty(self, sandbox_id: str, argv: list[str], cwd: Optional[str], env: dict[str, str],
                       rows: int, cols: int) -> PtyProcess:
        box = await self._ready(sandbox_id)
        return await self._agent(sandbox_id, self.agents.open_pty(box.agent, self._argv(box, argv),
                                                                  cwd or box.workdir, env, rows, cols))

    async def read_file(self, sandbox_id: str, path: str, limit: int) -> bytes:
        box = await self._ready(sandbox_id)
        return await self._agent(sandbox_id, self.agents.read_file(box.agent, path, limit))

    async def write_file(self, sandbox_id: str, path: str, data: bytes, mode: Optional[int]) -> None:
        box = await self._ready(sandbox_id)
        await self._agent(sandbox_id, self.agents.write_file(box.agent, path, data, mode))

    async def list_dir(self, sandbox_id: str, path: str) -> list[FileEntry]:
        box = await self._ready(sandbox_id)
        return await self._agent(sandbox_id, self.agents.list_dir(box.agent, path))

    async def snapshot(self, sandbox_id: str, image: str) -> int:
        raise errors.BackendError("Snapshots are not available on the Kubernetes backend: the Kubernetes API "
                                  "cannot commit a pod's filesystem to an image")

    # ------------------------------------------------------------ facts
    async def workdir(self, sandbox_id: str) -> str:
        """What the agent reported (a replica that did not create the sandbox attaches to it first)."""
        return (await self._ready(sandbox_id)).workdir

    def images(self) -> list[str]:
        return ["host"]

    def capacity(self) -> tuple[float, int]:
        return self._capacity

    def memory_used(self, sandbox_id: str) -> Optional[int]:
        return None


# ---------------------------------------------------------------- helpers
def _create_quietly(call, namespace: str, body: dict) -> None:
    """Create unless it exists already (409)."""
    try:
        call(namespace, body)
    except ApiException as e:
        if e.status != 409:
            raise


def _kinds(spec: SandboxSpec) -> tuple[bool, bool]:
    """Which policies of its own a sandbox has: (egress, model endpoint)."""
    return not spec.block_network, spec.model_endpoint is not None


def _resolve(endpoint: tuple[int, str, int]) -> list[str]:
    """The target's addresses as the service resolves them now (a pod of a closed sandbox has no DNS)."""
    _, host, port = endpoint
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise errors.SandboxFailedError(f"model_endpoint target {host!r} cannot be resolved: {e}") from e
    return list(dict.fromkeys(info[4][0] for info in infos))


def _created(meta) -> float:
    value = pods.created_at({"annotations": meta.annotations})
    if value is not None:
        return value
    return meta.creation_timestamp.timestamp() if meta.creation_timestamp else 0.0


def _why(e: BaseException) -> str:
    if isinstance(e, ApiException):
        body = e.body.decode() if isinstance(e.body, bytes) else (e.body or "")
        return f"{e.status} {e.reason}: {body[-300:]}".strip()
    if isinstance(e, errors.OrchardError):
        return e.detail
    return str(e)[-300:] or type(e).__name__
