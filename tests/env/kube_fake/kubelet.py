"""The fake kubelet: runs each new pod's init and sandbox containers as local processes and writes pod status.

A container is a bubblewrap "container" on this machine (it is a fake: no cgroup limits; every pod
reports podIP 127.0.0.1). A pod that an open egress policy selects shares this machine's network;
any other gets a network namespace of its own, reached through relays (network.py). Its root
is an empty tmpfs with this machine's /usr and /etc read-only (shadow files masked), emptyDir
volumes as directories, and the pod's commands run verbatim: the agent image is a directory holding
the agent package and a symlink to this machine's /usr/bin/python3, mounted at /opt/orchard-agent.

Because every agent is reached on 127.0.0.1, the fake picks a free port per pod and rewrites the pod's
named ``orchard-agent`` container port (and its ORCHARD_AGENT_PORT env) to it; on a cluster the
port is the one the backend set. Images whose name contains ``missing`` fail with ErrImagePull,
names that are not valid references with InvalidImageName, and so does every image the fake registry
does not hold (``--image``; by default the backend's default agent and host images).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Optional

from . import network
from .api import Store, now

AGENT_SOURCE = Path(__file__).resolve().parents[3] / "src" / "orchard" / "env" / "agent"
REFERENCE = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*(:[\w][\w.-]{0,127})?"
                       r"(@sha256:[0-9a-f]{64})?$")
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
READY_TIMEOUT = 60.0
DEFAULT_IMAGES = frozenset({"orchard/agent:0.1.0", "python:3.11-bookworm"})
BWRAP = shutil.which("bwrap") or "bwrap"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def image_problem(image: str, known: frozenset[str]) -> Optional[tuple[str, str]]:
    """Why the fake registry cannot give this image (None: it can)."""
    if not REFERENCE.match(image or ""):
        return "InvalidImageName", f'Failed to apply default image tag "{image}": couldn\'t parse image reference'
    if "missing" in image or image not in known:
        return "ErrImagePull", f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": not found'
    return None


class Kubelet:
    """Runs pods of the store's namespaces; ``root`` holds the agent image and every pod's volumes."""

    def __init__(self, store: Store, root: Path, images: frozenset[str] = DEFAULT_IMAGES):
        self.store, self.root, self.images = store, root, images
        self.image = self._agent_image(root / "agent-image")
        self.procs: dict[str, subprocess.Popen] = {}
        self.networks: dict[str, network.PodNetwork] = {}
        self.deleting: set[str] = set()
        self.lock = threading.Lock()
        store.on_create.append(lambda pod: threading.Thread(target=self.run_pod, args=(pod,), daemon=True).start())
        store.on_delete.append(self.stop_pod)

    @staticmethod
    def _agent_image(home: Path) -> Path:
        """The agent image's /opt/orchard-agent: lib/orchard_agent (the package) and python/bin/python3."""
        shutil.rmtree(home, ignore_errors=True)
        shutil.copytree(AGENT_SOURCE, home / "lib" / "orchard_agent", ignore=shutil.ignore_patterns("__pycache__"))
        (home / "python" / "bin").mkdir(parents=True)
        os.symlink("/usr/bin/python3", home / "python" / "bin" / "python3")
        return home

    # ---------------------------------------------------------- one pod
    def run_pod(self, pod: dict) -> None:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        try:
            self._run_pod(pod, ns, name)
        except Exception as e:          # a fake's bug shows up as a failed pod, never as a hang
            self._status(ns, name, phase="Failed", reason="FakeKubeletError", message=repr(e))

    def _run_pod(self, pod: dict, ns: str, name: str) -> None:
        spec = pod["spec"]
        home = self.root / "pods" / pod["metadata"]["uid"]
        volumes = {v["name"]: home / "volumes" / v["name"] for v in spec.get("volumes") or []}
        for path in volumes.values():
            path.mkdir(parents=True)
        for init in spec.get("initContainers") or []:
            if not self._run_init(ns, name, init, volumes, home):
                return
        self._start_main(ns, name, pod["metadata"], spec["containers"][0], volumes, home,
                         spec.get("hostname") or name)

    def _pulled(self, ns: str, name: str, container: dict, init: bool) -> bool:
        problem = image_problem(container.get("image", ""), self.images)
        if problem is None:
            return True
        reason, message = problem
        self._container_status(ns, name, container["name"], init, {"waiting": {"reason": reason, "message": message}})
        return False

    def _env(self, ns: str, name: str, container: dict, init: bool) -> Optional[dict]:
        env = dict(BASE_ENV)
        for item in container.get("env") or []:
            ref = (item.get("valueFrom") or {}).get("secretKeyRef")
            if ref is None:
                env[item["name"]] = item.get("value", "")
                continue
            secret = self.store.get("secrets", ns, ref["name"])
            if secret is None or ref["key"] not in secret.get("data", {}):
                why = f'secret "{ref["name"]}" not found'
                self._container_status(ns, name, container["name"], init,
                                       {"waiting": {"reason": "CreateContainerConfigError", "message": why}})
                return None
            env[item["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
        return env

    def _run_init(self, ns: str, name: str, init: dict, volumes: dict, home: Path) -> bool:
        if not self._pulled(ns, name, init, True):
            return False
        env = self._env(ns, name, init, True)
        if env is None:
            return False
        argv = self._bwrap(init, volumes, name, image_home=self.image)
        done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
        state = {"terminated": {"exitCode": done.returncode, "reason": "Completed" if done.returncode == 0 else "Error",
                                "message": done.stderr.decode(errors="replace")[-500:]}}
        self._container_status(ns, name, init["name"], True, state)
        return done.returncode == 0

    def _start_main(self, ns: str, name: str, meta: dict, main: dict, volumes: dict, home: Path,
                    hostname: str) -> None:
        if not self._pulled(ns, name, main, False):
            return
        port = free_port()
        self._rewrite_port(ns, name, main["name"], port)
        env = self._env(ns, name, main, False)
        if env is None:
            return
        env["ORCHARD_AGENT_PORT"] = str(port)
        uid = meta["uid"]
        proc = self._spawn(ns, uid, meta.get("labels") or {}, self._bwrap(main, volumes, hostname), env, home, port)
        if proc is None:
            return
        if self._answers(port, proc, self.networks.get(uid)):
            self._status(ns, name, phase="Running", ip="127.0.0.1", ready=True,
                         container=(main["name"], {"running": {"startedAt": now()}}))
        proc.wait()
        if uid not in self.deleting:
            code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
            state = {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}}
            if code and main.get("terminationMessagePolicy") == "FallbackToLogsOnError":
                state["terminated"]["message"] = _log_tail(home / "sandbox.log")
            self._status(ns, name, phase="Succeeded" if code == 0 else "Failed", ready=False,
                         container=(main["name"], state))

    def _spawn(self, ns: str, uid: str, labels: dict, argv: list[str], env: dict, home: Path,
               port: int) -> Optional[subprocess.Popen]:
        """The sandbox container's process (None: the pod is being deleted); a pod that no open egress policy
        selects runs in a network namespace of its own (bwrap tells its pid there through a pipe)."""
        rules = network.egress_rules(self._policies(ns), labels)
        info_read, info_write = (None, None) if network.is_open(rules) else os.pipe()
        if info_write is not None:
            argv = [argv[0], "--unshare-net", "--info-fd", str(info_write), *argv[1:]]
        with open(home / "sandbox.log", "wb") as log, self.lock:
            proc = None
            if uid not in self.deleting:
                proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                        start_new_session=True, pass_fds=() if info_write is None else (info_write,))
                self.procs[uid] = proc
        if info_write is not None:
            os.close(info_write)
            if proc is None:
                os.close(info_read)
            else:
                self._join_network(uid, info_read, port, network.loopback_allowances(rules))
        return proc

    def _policies(self, ns: str) -> list[dict]:
        """The namespace's NetworkPolicies (read directly: the kubelet's reads are not API calls of the backend)."""
        with self.store.lock:
            return [obj for (kind, n, _), obj in self.store.objects.items() if kind == "networkpolicies" and n == ns]

    def _join_network(self, uid: str, info_fd: int, port: int, allowances: list[tuple[str, int]]) -> None:
        """Relays into and out of the pod's network namespace, once bwrap says which process holds it."""
        with os.fdopen(info_fd, "rb") as info:
            raw = info.read()
        if not raw:
            return          # bwrap failed before its child existed: the pod fails as its process exits
        pod_network = network.PodNetwork(json.loads(raw)["child-pid"], port, allowances)
        with self.lock:
            if uid in self.deleting:
                pod_network.close()
                return
            self.networks[uid] = pod_network

    def _answers(self, port: int, proc: subprocess.Popen, pod_network: Optional[network.PodNetwork]) -> bool:
        """The readiness probe: the agent accepts connections (polled, as a kubelet's probe is)."""
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if pod_network is not None:
                    pod_network.agent_connection().close()
                else:
                    socket.create_connection(("127.0.0.1", port), 1).close()
                return True
            except OSError:
                time.sleep(0.05)
        return False

    def _bwrap(self, container: dict, volumes: dict, hostname: str,
               image_home: Optional[Path] = None) -> list[str]:
        argv = [BWRAP, "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", hostname,
                "--cap-drop", "ALL", "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc",
                "--ro-bind", "/dev/null", "/etc/shadow", "--ro-bind", "/dev/null", "/etc/gshadow",
                "--dev", "/dev", "--proc", "/proc", "--perms", "1777", "--tmpfs", "/tmp", "--dir", "/root",
                "--dir", "/run", "--chdir", container.get("workingDir") or "/"]
        for link in ("bin", "lib", "lib64", "sbin"):
            argv += ["--symlink", f"usr/{link}", f"/{link}"]
        if image_home is not None:
            argv += ["--ro-bind", str(image_home), "/opt/orchard-agent"]
        for mount in container.get("volumeMounts") or []:
            flag = "--ro-bind" if mount.get("readOnly") else "--bind"
            argv += [flag, str(volumes[mount["name"]]), mount["mountPath"]]
        return argv + ["--", *container["command"], *(container.get("args") or [])]

    # ---------------------------------------------------------- status writes
    def _rewrite_port(self, ns: str, name: str, container: str, port: int) -> None:
        def change(pod: dict) -> None:
            for c in pod["spec"]["containers"]:
                if c["name"] == container:
                    for p in c.get("ports") or []:
                        if p.get("name") == "orchard-agent":
                            p["containerPort"] = port
        self.store.update("pods", ns, name, change)

    def _container_status(self, ns: str, name: str, container: str, init: bool, state: dict) -> None:
        key = "initContainerStatuses" if init else "containerStatuses"

        def change(pod: dict) -> None:
            statuses = [s for s in pod["status"].get(key) or [] if s["name"] != container]
            spec = pod["spec"].get("initContainers" if init else "containers") or []
            image = next((c["image"] for c in spec if c["name"] == container), "")
            statuses.append(_container(container, image, state))
            pod["status"][key] = statuses
        self.store.update("pods", ns, name, change)

    def _status(self, ns: str, name: str, phase: str, ip: Optional[str] = None, ready: Optional[bool] = None,
                reason: Optional[str] = None, message: Optional[str] = None,
                container: Optional[tuple[str, dict]] = None) -> None:
        def change(pod: dict) -> None:
            status = pod["status"]
            status["phase"] = phase
            if ip:
                status["podIP"] = status["hostIP"] = ip
                status["podIPs"] = [{"ip": ip}]
            if ready is not None:
                status["conditions"] = [{"type": "PodScheduled", "status": "True"},
                                        {"type": "Ready", "status": "True" if ready else "False"}]
            if reason:
                status["reason"], status["message"] = reason, message or ""
            if container:
                image = pod["spec"]["containers"][0]["image"]
                status["containerStatuses"] = [_container(container[0], image, container[1])]
        self.store.update("pods", ns, name, change)

    # ---------------------------------------------------------- delete
    def stop_pod(self, pod: dict) -> None:
        uid = pod["metadata"]["uid"]
        with self.lock:
            self.deleting.add(uid)
            proc = self.procs.pop(uid, None)
            pod_network = self.networks.pop(uid, None)
        if pod_network is not None:
            pod_network.close()
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(pod["spec"].get("terminationGracePeriodSeconds") or 2)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(self.root / "pods" / uid, ignore_errors=True)

    def stop_all(self) -> None:
        with self.lock:
            procs = list(self.procs.values())
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)


def _log_tail(path: Path) -> str:
    """What a kubelet reports of a failed container's log under FallbackToLogsOnError (its last 2 KiB here)."""
    try:
        return path.read_bytes()[-2048:].decode(errors="replace").strip()
    except OSError:
        return ""


def _container(name: str, image: str, state: dict) -> dict:
    """A containerStatuses entry with the fields a real kubelet always writes."""
    return {"name": name, "image": image, "imageID": "", "restartCount": 0, "ready": "running" in state,
            "started": "running" in state, "state": state}
