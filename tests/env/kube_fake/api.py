"""The fake API server's objects and HTTP surface: pods, Secrets, NetworkPolicies, namespaces and nodes, with watches.

It speaks the subset of the Kubernetes REST API the Kubernetes backend uses: create, get, list
(with ``labelSelector``), delete, and ``?watch=true`` streams of ADDED/MODIFIED/DELETED events as
JSON lines (chunked) from a ``resourceVersion``; a version older than the kept history gets the
410 Gone ERROR event a real API server sends. Status changes come from the fake kubelet.
"""

from __future__ import annotations

import base64
import copy
import datetime
import json
import queue
import re
import socket
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional
from urllib.parse import parse_qs, urlsplit

KINDS = {"pods": ("v1", "Pod"), "secrets": ("v1", "Secret"), "networkpolicies": ("networking.k8s.io/v1", "NetworkPolicy")}
ROUTE = re.compile(r"^/(?:api/v1|apis/networking\.k8s\.io/v1)/namespaces/([^/]+)/(pods|secrets|networkpolicies)(?:/([^/]+))?$")
NAMESPACE = re.compile(r"^/api/v1/namespaces/([^/]+)$")
NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def matches(labels: dict, selector: str) -> bool:
    """Equality-based label selectors: k=v, k==v, k!=v, k, !k (comma-joined)."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k) != v:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


class Store:
    """Objects by (kind, namespace, name), a global resourceVersion, the event history and live watchers."""

    def __init__(self, namespaces: list[str], history: int = 10_000):
        self.namespaces = set(namespaces)
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.version = 0
        self.history: list[tuple[int, str, str, dict]] = []     # (version, kind, event type, object)
        self.history_limit = history
        self.lock = threading.RLock()
        self.watchers: list[tuple[str, str, str, queue.Queue]] = []
        self.on_create: list[Callable[[dict], None]] = []
        self.on_delete: list[Callable[[dict], None]] = []
        self.calls: list[tuple[str, str, str]] = []                # (verb, kind, name) for tests that count calls

    def _bump(self, kind: str, event: str, obj: dict) -> None:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        snapshot = copy.deepcopy(obj)
        self.history.append((self.version, kind, event, snapshot))
        del self.history[:-self.history_limit]
        for wkind, ns, sel, q in list(self.watchers):
            meta = snapshot["metadata"]
            if wkind == kind and ns == meta["namespace"] and matches(meta.get("labels") or {}, sel):
                q.put((event, snapshot))

    def compact(self) -> None:
        """Forget the event history (watches from older versions then get 410 Gone)."""
        with self.lock:
            self.history.clear()

    def create(self, kind: str, ns: str, obj: dict) -> tuple[int, dict]:
        meta = obj.setdefault("metadata", {})
        name = meta.get("name") or ""
        if not NAME.match(name):
            return 422, status_body(422, "Invalid", f"metadata.name {name!r} is invalid")
        with self.lock:
            if ns not in self.namespaces:
                return 404, status_body(404, "NotFound", f'namespaces "{ns}" not found')
            if (kind, ns, name) in self.objects:
                return 409, status_body(409, "AlreadyExists", f'{kind} "{name}" already exists')
            api, kind_name = KINDS[kind]
            obj.update(apiVersion=api, kind=kind_name)
            meta.update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=now())
            if kind == "secrets":
                data = obj.setdefault("data", {})
                for k, v in (obj.pop("stringData", None) or {}).items():
                    data[k] = base64.b64encode(v.encode()).decode()
            if kind == "pods":
                obj["status"] = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}
            self.objects[(kind, ns, name)] = obj
            self._bump(kind, "ADDED", obj)
            self.calls.append(("create", kind, name))
            created = copy.deepcopy(obj)
        for hook in self.on_create if kind == "pods" else []:
            hook(created)
        return 201, created

    def get(self, kind: str, ns: str, name: str) -> Optional[dict]:
        with self.lock:
            obj = self.objects.get((kind, ns, name))
            return copy.deepcopy(obj) if obj else None

    def read(self, kind: str, ns: str, name: str) -> Optional[dict]:
        """A client's GET of one object (counted in calls; the kubelet's own reads use get)."""
        with self.lock:
            self.calls.append(("get", kind, name))
            return self.get(kind, ns, name)

    def list(self, kind: str, ns: str, selector: str) -> dict:
        with self.lock:
            self.calls.append(("list", kind, ""))
            items = [copy.deepcopy(o) for (k, n, _), o in self.objects.items()
                     if k == kind and n == ns and matches(o["metadata"].get("labels") or {}, selector)]
            return {"kind": KINDS[kind][1] + "List", "apiVersion": KINDS[kind][0],
                    "metadata": {"resourceVersion": str(self.version)}, "items": items}

    def update(self, kind: str, ns: str, name: str, change: Callable[[dict], None]) -> Optional[dict]:
        """Apply change(obj) and emit MODIFIED (the kubelet's status writes)."""
        with self.lock:
            obj = self.objects.get((kind, ns, name))
            if obj is None:
                return None
            change(obj)
            self._bump(kind, "MODIFIED", obj)
            return copy.deepcopy(obj)

    def delete(self, kind: str, ns: str, name: str) -> tuple[int, dict]:
        with self.lock:
            obj = self.objects.get((kind, ns, name))
            if obj is None:
                return 404, status_body(404, "NotFound", f'{kind} "{name}" not found')
            self.calls.append(("delete", kind, name))
            if kind == "pods" and self.on_delete:
                if not obj["metadata"].get("deletionTimestamp"):
                    obj["metadata"]["deletionTimestamp"] = now()
                    self._bump(kind, "MODIFIED", obj)
                    doomed = copy.deepcopy(obj)
                    threading.Thread(target=self._finish_delete, args=(doomed,), daemon=True).start()
                return 200, copy.deepcopy(obj)
            return 200, self.remove(kind, ns, name) or obj

    def _finish_delete(self, pod: dict) -> None:
        for hook in self.on_delete:
            hook(pod)
        self.remove("pods", pod["metadata"]["namespace"], pod["metadata"]["name"])

    def remove(self, kind: str, ns: str, name: str) -> Optional[dict]:
        with self.lock:
            obj = self.objects.pop((kind, ns, name), None)
            if obj is not None:
                self._bump(kind, "DELETED", obj)
            return obj

    def watch(self, kind: str, ns: str, selector: str, since: str) -> tuple[queue.Queue, Callable[[], None]]:
        """A queue of (event, object) from after version ``since``; ("ERROR", status) when it is too old."""
        q: queue.Queue = queue.Queue()
        entry = (kind, ns, selector, q)
        with self.lock:
            start = int(since or self.version)
            oldest = self.history[0][0] if self.history else self.version + 1
            if start < oldest - 1 and start < self.version:
                q.put(("ERROR", status_body(410, "Expired", f"too old resource version: {start} ({oldest - 1})")))
            else:
                for version, k, event, obj in self.history:
                    meta = obj["metadata"]
                    if (version > start and k == kind and meta["namespace"] == ns
                            and matches(meta.get("labels") or {}, selector)):
                        q.put((event, obj))
            self.watchers.append(entry)
        return q, lambda: self._unwatch(entry)

    def _unwatch(self, entry) -> None:
        with self.lock:
            if entry in self.watchers:
                self.watchers.remove(entry)


def status_body(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
            "message": message, "metadata": {}}


class FakeApiServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple, store: Store, nodes: list[dict]):
        super().__init__(address, Handler)
        self.store, self.nodes = store, nodes
        self.stopping = threading.Event()
        self.connections: set = set()

    def process_request(self, request, client_address) -> None:
        self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request) -> None:
        self.connections.discard(request)
        super().shutdown_request(request)

    def stop(self) -> None:
        """Stop serving and cut every open connection (kept-alive ones included), as a dead API server would."""
        self.stopping.set()
        self.shutdown()
        self.server_close()
        for conn in list(self.connections):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True      # a reply is headers then body: no 40 ms delayed-ACK stall between them
    server: FakeApiServer

    def log_message(self, *args) -> None:
        pass

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _parts(self):
        split = urlsplit(self.path)
        return split.path, {k: v[-1] for k, v in parse_qs(split.query).items()}

    def do_GET(self) -> None:
        path, query = self._parts()
        if path == "/api/v1/nodes":
            return self._send(200, {"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": self.server.nodes})
        ns_match = NAMESPACE.match(path)
        if ns_match:
            ns = ns_match.group(1)
            if ns not in self.server.store.namespaces:
                return self._send(404, status_body(404, "NotFound", f'namespaces "{ns}" not found'))
            return self._send(200, {"kind": "Namespace", "apiVersion": "v1",
                                    "metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}}})
        route = ROUTE.match(path)
        if not route:
            return self._send(404, status_body(404, "NotFound", f"no route {path}"))
        ns, kind, name = route.groups()
        if name:
            obj = self.server.store.read(kind, ns, name)
            return self._send(200, obj) if obj else self._send(404, status_body(404, "NotFound", f"{name} not found"))
        if query.get("watch") in ("true", "1"):
            return self._watch(kind, ns, query)
        self._send(200, self.server.store.list(kind, ns, query.get("labelSelector", "")))

    def do_POST(self) -> None:
        path, _ = self._parts()
        route = ROUTE.match(path)
        if not route or route.group(3):
            return self._send(405, status_body(405, "MethodNotAllowed", f"cannot POST {path}"))
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        except ValueError as e:
            return self._send(400, status_body(400, "BadRequest", f"body is not JSON: {e}"))
        code, obj = self.server.store.create(route.group(2), route.group(1), body)
        self._send(code, obj)

    def do_DELETE(self) -> None:
        path, _ = self._parts()
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        route = ROUTE.match(path)
        if not route or not route.group(3):
            return self._send(405, status_body(405, "MethodNotAllowed", f"cannot DELETE {path}"))
        ns, kind, name = route.groups()
        self._send(*self.server.store.delete(kind, ns, name))

    def _watch(self, kind: str, ns: str, query: dict) -> None:
        q, stop = self.server.store.watch(kind, ns, query.get("labelSelector", ""), query.get("resourceVersion", ""))
        timeout = float(query.get("timeoutSeconds") or 1800)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.close_connection = True
        try:
            self._stream(q, timeout)
        except OSError:
            pass
        finally:
            stop()

    def _stream(self, q: queue.Queue, timeout: float) -> None:
        import time
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.server.stopping.is_set():
            try:
                event, obj = q.get(timeout=0.5)
            except queue.Empty:
                continue
            line = json.dumps({"type": event, "object": obj}).encode() + b"\n"
            self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
            self.wfile.flush()
            if event == "ERROR":
                break
        self.wfile.write(b"0\r\n\r\n")
