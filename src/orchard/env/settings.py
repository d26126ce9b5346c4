"""Typed settings of the Orchard Env service, read from ORCHARD_* environment variables."""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path
from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from typing_extensions import Annotated


def _replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _split(value: object) -> object:
    if isinstance(value, str):
        return [part.strip() for part in value.replace(";", ",").split(",") if part.strip()]
    return value


class Settings(BaseSettings):
    """Every knob of the service; each field also reads ORCHARD_<NAME>."""

    model_config = SettingsConfigDict(env_prefix="ORCHARD_", extra="forbid", validate_default=True)

    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(8080, ge=0, le=65535, description="Port to listen on.")
    backend: Literal["local", "container", "kubernetes"] = Field(
        "local", description="Where sandboxes run: local (bubblewrap), container (Docker API) or kubernetes (one pod per sandbox).")
    state_dir: Path = Field(Path("/var/lib/orchard"), description="SQLite state, images and sandbox layers.")
    namespace: str = Field("orchard", description="Namespace name reported for sandboxes.")
    store: Literal["sqlite", "redis"] = Field(
        "sqlite", description="Where state lives: sqlite (embedded, one replica) or redis (several replicas share it).")
    redis_url: Optional[str] = Field(None, description="redis://host:port/db of the shared store (store=redis).")
    redis_prefix: str = Field("orchard", min_length=1, description="Prefix of every Redis key (several deployments may share one Redis).")
    replica_id: str = Field(default_factory=_replica_id, min_length=1,
                            description="This replica's name among replicas (default hostname-pid; a stable name lets a restart fail its own interrupted jobs at once).")
    lease_seconds: float = Field(
        10.0, gt=0, description="Heartbeat and exec-lock lease of a replica (store=redis): a dead replica frees its sandboxes and has its jobs failed after about this long.")
    api_keys: Annotated[list[str], NoDecode] = Field(default_factory=list, description="Accepted X-API-Key values.")
    admin_keys: Annotated[list[str], NoDecode] = Field(default_factory=list, description="Keys that see every sandbox.")
    no_auth: bool = Field(False, description="Accept requests without a key (local use only).")

    default_cpu: str = Field("1", description="CPU limit when a create request gives none.")
    default_memory: str = Field("2Gi", description="Memory limit when a create request gives none.")
    default_disk: str = Field("10Gi", description="Size of a sandbox's writable layer when a create request gives none.")
    writable_layer: Literal["tmpfs", "disk"] = Field(
        "tmpfs", description="tmpfs: size-limited, charged to the sandbox's memory; disk: unlimited, under the state dir.")
    default_pids: int = Field(1024, gt=0, description="Process limit of every sandbox.")
    ready_timeout: int = Field(600, gt=0, description="Readiness wait (s) when a create request gives none.")
    create_reply_wait: float = Field(1.0, ge=0, description="How long POST /sandboxes waits for readiness before answering 'pending'.")
    pending_buffer: float = Field(60.0, ge=0, description="Extra seconds past the readiness timeout before a pending sandbox is failed.")
    ttl_seconds: int = Field(7200, gt=0, description="Lifetime of a sandbox.")
    max_ttl_seconds: int = Field(86400, gt=0, description="Largest TTL a request or heartbeat may ask for.")
    heartbeat_timeout: float = Field(300.0, gt=0, description="Delete a sandbox that sent heartbeats and then stopped for this long.")
    heartbeat_extends_ttl: bool = Field(True, description="A heartbeat pushes the TTL deadline out by ttl_seconds.")
    reconcile_interval: float = Field(30.0, gt=0, description="Seconds between lifecycle passes.")
    reconcile_min_age: float = Field(120.0, ge=0, description="Unowned sandboxes younger than this are left alone.")
    max_sandboxes: int = Field(4096, gt=0, description="Live sandboxes allowed at once; more get 503.")
    max_pending_creates: int = Field(2048, gt=0, description="Creates queued or starting; more get 503.")
    create_concurrency: int = Field(16, gt=0, description="Sandboxes the backend starts at once; the rest queue.")

    exec_timeout: int = Field(300, gt=0, description="Default exec timeout_seconds.")
    exec_wait_max: float = Field(60.0, gt=0, description="Longest server-side wait of exec wait=true and /jobs/{id}/wait.")
    max_concurrent_execs: int = Field(64, gt=0, description="Execs running at once across all sandboxes.")
    max_queued_execs: int = Field(4096, gt=0, description="Execs waiting for a slot; more get 503.")
    per_sandbox_execs: int = Field(1, gt=0, description="Execs running at once in one sandbox.")
    output_limit: int = Field(16 * 2**20, gt=0, description="Bytes of stdout and of stderr kept per job.")
    max_file_bytes: int = Field(256 * 2**20, gt=0, description="Largest upload or download.")
    max_body_bytes: int = Field(400 * 2**20, gt=0, description="Largest request body.")
    job_retention_seconds: float = Field(7 * 86400, gt=0, description="Finished jobs are kept this long.")

    image_roots: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Directories under which root-filesystem directory images may be named.")
    tools_dir: Optional[Path] = Field(
        None, description="Host directory every sandbox sees read-only at /opt/orchard/tools (harness binaries; `orchard harness install`).")
    forward_allowlist: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Host endpoints 'host:port' that model_endpoint may name.")
    network_bridge: Optional[str] = Field(None, description="Bridge of networked sandboxes (default: derived from the state dir).")
    network_subnet: Optional[str] = Field(None, description="IPv4 /16 of networked sandboxes (default: 10.X.0.0/16 derived from the state dir).")
    docker_host: str = Field("unix:///var/run/docker.sock",
                             description="Docker Engine API of the container backend (Docker, or Podman's compatible socket).")
    container_exec: Literal["auto", "api"] = Field(
        "auto", description="Container backend: auto enters containers with the helper when the engine runs on this host; api always uses the engine API.")
    cgroups_required: bool = Field(True, description="Fail sandbox creation when cgroup limits cannot be applied.")

    kube_namespace: str = Field("orchard-sandboxes", min_length=1, description="Kubernetes backend: namespace of the sandbox pods.")
    kube_config: Optional[Path] = Field(
        None, description="Kubernetes backend: kubeconfig file (default: the in-cluster service account, else ~/.kube/config).")
    kube_agent_image: str = Field("orchard/agent:0.1.0", min_length=1,
                                  description="Kubernetes backend: image of the init container that brings the in-pod agent.")
    kube_agent_port: int = Field(7070, gt=0, le=65535, description="Kubernetes backend: port the in-pod agent listens on.")
    kube_service_labels: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=lambda: {"app.kubernetes.io/name": "orchard-env"},
        description="Kubernetes backend: labels ('k=v,k2=v2') of the service pods, the only ones allowed to reach agents.")
    kube_service_namespace: str = Field("orchard", min_length=1, description="Kubernetes backend: namespace of the service pods.")
    kube_blocked_cidrs: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16",
                                 "127.0.0.0/8", "0.0.0.0/8", "224.0.0.0/4", "240.0.0.0/4"],
        description="Kubernetes backend: IPv4 CIDRs networked sandboxes never reach (pod and service CIDRs, "
                    "the metadata endpoint, private ranges); add the cluster's CIDRs when they are public.")
    kube_image_pull_secrets: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Kubernetes backend: names of image pull Secrets in the sandbox namespace.")
    kube_agent_pool: int = Field(256, gt=0, description="Kubernetes backend: most HTTP connections to agents at once.")
    kube_runtime_class: Optional[str] = Field(None, description="Kubernetes backend: RuntimeClass of sandbox pods (e.g. gvisor, kata).")
    kube_node_selector: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict, description="Kubernetes backend: node labels ('k=v,k2=v2') sandbox pods must land on.")
    kube_host_image: str = Field("python:3.11-bookworm", min_length=1,
                                 description="Kubernetes backend: the image started for the image name 'host'.")

    @model_validator(mode="after")
    def _redis_needs_url(self) -> "Settings":
        if self.store == "redis" and not self.redis_url:
            raise ValueError("store=redis needs redis_url (ORCHARD_REDIS_URL or --redis-url)")
        return self

    @field_validator("api_keys", "admin_keys", "forward_allowlist", "image_roots", "kube_blocked_cidrs",
                     "kube_image_pull_secrets", mode="before")
    @classmethod
    def _comma_list(cls, value: object) -> object:
        return _split(value)

    @field_validator("tools_dir")
    @classmethod
    def _absolute_tools_dir(cls, value: Optional[Path]) -> Optional[Path]:
        if value is not None and not value.is_absolute():
            raise ValueError(f"tools_dir must be an absolute path, got {str(value)!r}")
        return value

    @field_validator("kube_service_labels", "kube_node_selector", mode="before")
    @classmethod
    def _label_map(cls, value: object) -> object:
        if isinstance(value, str):
            pairs = [part.split("=", 1) for part in _split(value)]
            if any(len(pair) != 2 or not pair[0] for pair in pairs):
                raise ValueError("expected labels as 'key=value,key2=value2'")
            return {k.strip(): v.strip() for k, v in pairs}
        return value

    @field_validator("kube_blocked_cidrs")
    @classmethod
    def _ipv4_cidrs(cls, value: list[str]) -> list[str]:
        for cidr in value:
            try:
                if ipaddress.ip_network(cidr).version != 4:
                    raise ValueError
            except ValueError:
                raise ValueError(f"kube_blocked_cidrs: {cidr!r} is not an IPv4 CIDR like 10.0.0.0/8") from None
        return value

    def auth_enabled(self) -> bool:
        """Auth is on unless switched off explicitly."""
        return not self.no_auth

    def sqlite_path(self) -> Path:
        """Where the embedded database lives."""
        return self.state_dir / "orchard.db"

    def resolved_forward(self, target: str) -> Optional[tuple[str, int]]:
        """(host, port) when target is in the allowlist, else None."""
        if target not in self.forward_allowlist:
            return None
        host, _, port = target.rpartition(":")
        return host.strip("[]"), int(port)
