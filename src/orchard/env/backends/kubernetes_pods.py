"""The Kubernetes objects of the Kubernetes backend, as plain data: sandbox pods, token Secrets, NetworkPolicies.

A sandbox with a model endpoint also gets a NetworkPolicy allowing exactly its target's addresses
and port, and the agent an env var naming them (it relays 127.0.0.1:port to them).

Every object carries ``app.kubernetes.io/managed-by=orchard`` and ``orchard.dev/service=<namespace
setting>`` (so two deployments sharing one sandbox namespace never touch each other's objects);
per-sandbox objects also carry ``orchard.dev/sandbox=<id>``. Nothing here talks to a cluster.
"""

from __future__ import annotations

from typing import Optional, Sequence

from orchard.env import agent
from orchard.env.agent import relay
from orchard.env.backends.base import SandboxSpec
from orchard.env.settings import Settings

MANAGED_BY = "app.kubernetes.io/managed-by"
SANDBOX_LABEL = "orchard.dev/sandbox"
SERVICE_LABEL = "orchard.dev/service"
CREATED_AT = "orchard.dev/created-at"
OWNER = "orchard.dev/owner"
AGENT_PORT_NAME = "orchard-agent"
SANDBOX_CONTAINER = "sandbox"
INSTALL_CONTAINER = "orchard-agent-install"
AGENT_VOLUME, TOKEN_VOLUME = "orchard-agent", "orchard-agent-token"
AGENT_COPY = "/orchard-agent-copy"            # where the init container sees the agent volume
TOKEN_COPY = "/orchard-agent-token"           # ...and the token volume
DENY_EGRESS = "orchard-default-deny-egress"
AGENT_INGRESS = "orchard-agent-ingress"
GRACE_SECONDS = 2
SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}}
INSTALL_RESOURCES = {"cpu": "100m", "memory": "64Mi", "ephemeral-storage": "16Mi"}


def pod_name(sandbox_id: str) -> str:
    return f"orchard-{sandbox_id}"


def secret_name(sandbox_id: str) -> str:
    return f"orchard-{sandbox_id}-token"


def egress_name(sandbox_id: str) -> str:
    return f"orchard-{sandbox_id}-egress"


def model_name(sandbox_id: str) -> str:
    return f"orchard-{sandbox_id}-model"


def common_labels(settings: Settings) -> dict[str, str]:
    return {MANAGED_BY: "orchard", SERVICE_LABEL: settings.namespace}


def selector(settings: Settings) -> str:
    """The label selector of every object this service manages."""
    return ",".join(f"{k}={v}" for k, v in common_labels(settings).items())


def _meta(settings: Settings, name: str, spec: SandboxSpec) -> dict:
    return {"name": name, "namespace": settings.kube_namespace,
            "labels": {**common_labels(settings), SANDBOX_LABEL: spec.sandbox_id},
            "annotations": {CREATED_AT: repr(spec.created_at), OWNER: settings.replica_id}}


def token_secret(settings: Settings, spec: SandboxSpec, token: str) -> dict:
    """The sandbox's agent token; only the init container reads it (as env), never the sandbox's processes."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _meta(settings, secret_name(spec.sandbox_id), spec), "stringData": {"token": token}}


def resources(spec: SandboxSpec) -> dict:
    """Requests equal to limits (what a sandbox may use is what the scheduler reserves)."""
    amounts: dict[str, str] = {}
    if spec.cpu:
        amounts["cpu"] = f"{max(1, round(spec.cpu * 1000))}m"
    if spec.memory:
        amounts["memory"] = str(spec.memory)
    if spec.disk:
        amounts["ephemeral-storage"] = str(spec.disk)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def sandbox_pod(settings: Settings, spec: SandboxSpec, image: str, model_addresses: Sequence[str] = ()) -> dict:
    """One pod per sandbox: the init container installs the agent, the sandbox container runs it as its main process.

    ``model_addresses``: the resolved addresses of spec.model_endpoint's target, which the agent relays to."""
    pod_spec: dict = {
        "restartPolicy": "Never", "terminationGracePeriodSeconds": GRACE_SECONDS,
        "automountServiceAccountToken": False, "enableServiceLinks": False,
        "hostname": spec.sandbox_id, "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "volumes": [{"name": AGENT_VOLUME, "emptyDir": {"sizeLimit": "512Mi"}},
                    {"name": TOKEN_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}],
        "initContainers": [_install_container(settings, spec)],
        "containers": [_sandbox_container(settings, spec, image, model_addresses)],
    }
    if settings.kube_image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in settings.kube_image_pull_secrets]
    if settings.kube_runtime_class:
        pod_spec["runtimeClassName"] = settings.kube_runtime_class
    if settings.kube_node_selector:
        pod_spec["nodeSelector"] = dict(settings.kube_node_selector)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": _meta(settings, pod_name(spec.sandbox_id), spec),
            "spec": pod_spec}


def _install_container(settings: Settings, spec: SandboxSpec) -> dict:
    token = {"secretKeyRef": {"name": secret_name(spec.sandbox_id), "key": "token"}}
    return {"name": INSTALL_CONTAINER, "image": settings.kube_agent_image, "imagePullPolicy": "IfNotPresent",
            "command": [agent.PYTHON, "-I", "-c", agent.boot_code("install"), AGENT_COPY, TOKEN_COPY],
            "env": [{"name": agent.TOKEN_ENV, "valueFrom": token}],
            "volumeMounts": [{"name": AGENT_VOLUME, "mountPath": AGENT_COPY},
                             {"name": TOKEN_VOLUME, "mountPath": TOKEN_COPY}],
            "securityContext": dict(SECURITY),
            "resources": {"requests": dict(INSTALL_RESOURCES), "limits": dict(INSTALL_RESOURCES)}}


def _sandbox_container(settings: Settings, spec: SandboxSpec, image: str, model_addresses: Sequence[str]) -> dict:
    port = settings.kube_agent_port
    env = [{"name": agent.PORT_ENV, "value": str(port)}]
    if spec.model_endpoint is not None and model_addresses:
        local_port, _, target_port = spec.model_endpoint
        env.append({"name": agent.RELAY_ENV,
                    "value": relay.format_relay(local_port, [(a, target_port) for a in model_addresses])})
    return {"name": SANDBOX_CONTAINER, "image": image,
            "command": [agent.PYTHON, "-I", "-c", agent.boot_code("server")],
            "env": env,
            "ports": [{"name": AGENT_PORT_NAME, "containerPort": port, "protocol": "TCP"}],
            "volumeMounts": [{"name": AGENT_VOLUME, "mountPath": agent.HOME, "readOnly": True},
                             {"name": TOKEN_VOLUME, "mountPath": agent.TOKEN_DIR}],
            "readinessProbe": {"httpGet": {"path": agent.HEALTH, "port": AGENT_PORT_NAME},
                               "periodSeconds": 1, "failureThreshold": 3},
            "terminationMessagePolicy": "FallbackToLogsOnError",     # why the agent stopped, in the pod status
            "securityContext": dict(SECURITY), "resources": resources(spec)}


def default_deny_egress(settings: Settings) -> dict:
    """Namespace-wide: no pod in the sandbox namespace sends anything unless a policy of its own allows it."""
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": DENY_EGRESS, "namespace": settings.kube_namespace, "labels": common_labels(settings)},
            "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": []}}


def agent_ingress(settings: Settings) -> dict:
    """Only the service's pods reach sandbox pods, and only on the agent port."""
    source = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": settings.kube_service_namespace}},
              "podSelector": {"matchLabels": dict(settings.kube_service_labels)}}
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": AGENT_INGRESS, "namespace": settings.kube_namespace, "labels": common_labels(settings)},
            "spec": {"podSelector": {"matchLabels": {MANAGED_BY: "orchard"}}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [source], "ports": [{"protocol": "TCP", "port": settings.kube_agent_port}]}]}}


def sandbox_egress(settings: Settings, spec: SandboxSpec) -> dict:
    """A networked sandbox's own allowance: anywhere except the blocked CIDRs, plus DNS to the cluster's resolver."""
    dns = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
           "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}
    rules = [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": list(settings.kube_blocked_cidrs)}}]},
             {"to": [dns], "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}]
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": _meta(settings, egress_name(spec.sandbox_id), spec),
            "spec": {"podSelector": {"matchLabels": {SANDBOX_LABEL: spec.sandbox_id, **common_labels(settings)}},
                     "policyTypes": ["Egress"], "egress": rules}}


def model_egress(settings: Settings, spec: SandboxSpec, addresses: Sequence[str]) -> dict:
    """A model endpoint's allowance: TCP to the target's port on exactly its resolved addresses (/32 or /128)."""
    if spec.model_endpoint is None or not addresses:
        raise ValueError("model_egress needs a model endpoint and at least one address")
    blocks = [{"ipBlock": {"cidr": f"{a}/{128 if ':' in a else 32}"}} for a in addresses]
    rules = [{"to": blocks, "ports": [{"protocol": "TCP", "port": spec.model_endpoint[2]}]}]
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": _meta(settings, model_name(spec.sandbox_id), spec),
            "spec": {"podSelector": {"matchLabels": {SANDBOX_LABEL: spec.sandbox_id, **common_labels(settings)}},
                     "policyTypes": ["Egress"], "egress": rules}}


def agent_port(pod: dict, default: int) -> int:
    """The agent's port as the pod declares it (its named container port)."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == AGENT_PORT_NAME:
                return int(port["containerPort"])
    return default


def created_at(meta: dict) -> Optional[float]:
    try:
        return float((meta.get("annotations") or {})[CREATED_AT])
    except (KeyError, TypeError, ValueError):
        return None
