"""A watch-fed cache of the sandbox pods' phase, IP, agent port and failure reason that wakes waiters on events.

One LIST at start, then one WATCH from its resourceVersion, in a thread; an expired watch (410
Gone) or a broken stream re-lists. Each change is handed to the event loop, where ``wait`` wakes:
nothing polls the API server.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from orchard.env.backends import kubernetes_pods as pods

log = logging.getLogger("orchard.env")
WATCH_SECONDS = 300          # server-side length of one watch request (then it is re-opened from the last version)
RETRY_SECONDS = 1.0          # pause before re-listing after the API server failed
# waiting reasons that never heal by themselves: the sandbox is failed at once, with the reason
FATAL_WAITING = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError",
                 "CreateContainerError", "RunContainerError", "CrashLoopBackOff", "PreCreateHookError",
                 "PostStartHookError"}


@dataclass(frozen=True)
class PodState:
    """What the cache knows of one sandbox pod."""

    sandbox_id: str
    phase: str = "Pending"
    ip: Optional[str] = None
    port: int = 0
    ready: bool = False
    failure: Optional[str] = None        # why the pod can never (or no longer) serve
    created_at: float = 0.0
    deleted: bool = False

    @property
    def serving(self) -> bool:
        return self.ready and bool(self.ip) and self.failure is None and not self.deleted


def pod_state(pod: dict, default_port: int) -> Optional[PodState]:
    """Read one pod object; None when it is not a sandbox pod."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    sid = (meta.get("labels") or {}).get(pods.SANDBOX_LABEL)
    if not sid:
        return None
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return PodState(sandbox_id=sid, phase=status.get("phase") or "Pending", ip=status.get("podIP"),
                    port=pods.agent_port(pod, default_port), ready=ready, failure=failure_of(status),
                    created_at=pods.created_at(meta) or _timestamp(meta.get("creationTimestamp")),
                    deleted=bool(meta.get("deletionTimestamp")))


def failure_of(status: dict) -> Optional[str]:
    """Why a pod cannot serve: a fatal waiting reason, a terminated container, or a finished phase."""
    for kind in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(kind) or []:
            why = _container_failure(cs, init=kind.startswith("init"))
            if why:
                return why
    phase = status.get("phase")
    if phase in ("Failed", "Succeeded"):
        return f"The sandbox pod ended (phase {phase}{': ' + status['reason'] if status.get('reason') else ''}" \
               f"{' - ' + status['message'] if status.get('message') else ''})"
    return None


def _container_failure(cs: dict, init: bool) -> Optional[str]:
    state = cs.get("state") or {}
    name = cs.get("name", "?")
    waiting = state.get("waiting") or {}
    if waiting.get("reason") in FATAL_WAITING:
        return f"{waiting['reason']} in container {name}: {waiting.get('message') or 'no message'}"
    term = state.get("terminated")
    if term and not (init and term.get("exitCode") == 0):
        reason = term.get("reason") or "Terminated"
        return f"Container {name} ended: {reason} (exit code {term.get('exitCode')})" \
               f"{': ' + term['message'] if term.get('message') else ''}"
    return None


def _timestamp(value: Optional[str]) -> float:
    if not value:
        return 0.0
    try:
        return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
    except ValueError:
        return 0.0


class Informer:
    """The pod cache of one namespace and label selector."""

    def __init__(self, core, namespace: str, selector: str, default_port: int):
        self.core, self.namespace, self.selector, self.default_port = core, namespace, selector, default_port
        self.states: dict[str, PodState] = {}
        self.synced = False
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._changed: dict[str, asyncio.Event] = {}
        self._listeners: list[Callable[[Optional[PodState], PodState], None]] = []
        self._stop = threading.Event()
        self._watch: Optional[watch.Watch] = None
        self._thread: Optional[threading.Thread] = None
        self._version = ""

    def on_change(self, listener: Callable[[Optional[PodState], PodState], None]) -> None:
        """Call listener(old, new) in the event loop for every change (new.deleted for a removed pod)."""
        self._listeners.append(listener)

    async def start(self) -> None:
        """List once (raises ApiException/OSError when the API server cannot answer), then watch in a thread."""
        self._loop = asyncio.get_running_loop()
        await asyncio.to_thread(self._relist)
        self._thread = threading.Thread(target=self._run, daemon=True, name="orchard-kube-informer")
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()

    # ---------------------------------------------------------- the thread
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._watch_once()
            except ApiException as e:
                if e.status != 410:
                    log.warning("pod watch failed: %s %s", e.status, e.reason)
                    self._stop.wait(RETRY_SECONDS)
                self._relist_quietly()
            except Exception as e:              # a broken stream or an unreachable API server: list again
                if self._stop.is_set():
                    return
                log.warning("pod watch broke (%s); re-listing", e)
                self._stop.wait(RETRY_SECONDS)
                self._relist_quietly()

    def _relist_quietly(self) -> None:
        try:
            self._relist()
        except Exception as e:
            self.synced = False
            log.warning("listing sandbox pods failed: %s", e)

    def _relist(self) -> None:
        resp = self.core.list_namespaced_pod(self.namespace, label_selector=self.selector, _preload_content=False)
        listing = json.loads(resp.data)
        seen = {}
        for pod in listing.get("items") or []:
            state = pod_state(pod, self.default_port)
            if state is not None:
                seen[state.sandbox_id] = state
        for sid, old in list(self.states.items()):
            if sid not in seen:
                self._apply(PodState(sandbox_id=sid, phase=old.phase, deleted=True, created_at=old.created_at))
        for state in seen.values():
            self._apply(state)
        self._version = (listing.get("metadata") or {}).get("resourceVersion", "")
        self.synced = True

    def _watch_once(self) -> None:
        self._watch = watch.Watch()
        for event in self._watch.stream(self.core.list_namespaced_pod, self.namespace, label_selector=self.selector,
                                        resource_version=self._version, timeout_seconds=WATCH_SECONDS,
                                        allow_watch_bookmarks=True, deserialize=False):
            if self._stop.is_set():
                return
            self._event(event.get("type"), event.get("raw_object") or event.get("object") or {})

    def _event(self, kind: Optional[str], obj: dict) -> None:
        if kind == "ERROR":
            raise ApiException(status=obj.get("code") or 500, reason=obj.get("message") or "watch error")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if version:
            self._version = version
        if kind == "BOOKMARK":
            return
        state = pod_state(obj, self.default_port)
        if state is None:
            return
        if kind == "DELETED":
            state = PodState(sandbox_id=state.sandbox_id, phase=state.phase, deleted=True, created_at=state.created_at)
        self._apply(state)

    def _apply(self, state: PodState) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._publish, state)

    # ---------------------------------------------------------- the event loop
    def _publish(self, state: PodState) -> None:
        old = self.states.get(state.sandbox_id)
        if state.deleted:
            self.states.pop(state.sandbox_id, None)
        else:
            self.states[state.sandbox_id] = state
        event = self._changed.pop(state.sandbox_id, None)
        if event is not None:
            event.set()
        for listener in self._listeners:
            listener(old, state)

    async def wait(self, sandbox_id: str, done: Callable[[Optional[PodState]], bool],
                   timeout: Optional[float] = None) -> Optional[PodState]:
        """The pod's state once ``done(state)`` holds (state None: no such pod), woken only by watch events."""
        async def until() -> Optional[PodState]:
            while True:
                state = self.states.get(sandbox_id)
                if done(state):
                    return state
                event = self._changed.setdefault(sandbox_id, asyncio.Event())
                await event.wait()
        return await asyncio.wait_for(until(), timeout)
