"""The Kubernetes backend's objects as data: pod security and limits, labels, the token Secret, NetworkPolicies."""

from __future__ import annotations

import kubernetes_validate
import pytest
from kubernetes import client as kube

from orchard.env import agent
from orchard.env.backends import kubernetes_pods as pods
from orchard.env.backends.base import SandboxSpec
from orchard.env.settings import Settings


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(backend="kubernetes", state_dir=tmp_path, kube_image_pull_secrets="regcred",
                    kube_runtime_class="gvisor", kube_node_selector="pool=sandboxes", replica_id="r1")


SPEC = SandboxSpec("sb-1", "python:3.11-bookworm", cpu=0.5, memory=256 * 2**20, disk=2**30, created_at=1234.5)


def test_pod_security_context_and_service_account(settings):
    pod = pods.sandbox_pod(settings, SPEC, "python:3.11-bookworm")
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert spec["restartPolicy"] == "Never" and spec["terminationGracePeriodSeconds"] <= 5
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in spec["initContainers"] + spec["containers"]:
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["imagePullSecrets"] == [{"name": "regcred"}] and spec["runtimeClassName"] == "gvisor"
    assert spec["nodeSelector"] == {"pool": "sandboxes"}


def test_pod_limits_follow_the_request(settings):
    resources = pods.sandbox_pod(settings, SPEC, "img")["spec"]["containers"][0]["resources"]
    expected = {"cpu": "500m", "memory": str(256 * 2**20), "ephemeral-storage": str(2**30)}
    assert resources == {"requests": expected, "limits": expected}
    assert pods.resources(SandboxSpec("x", "img")) == {"requests": {}, "limits": {}}


def test_pod_labels_annotations_and_agent_wiring(settings):
    pod = pods.sandbox_pod(settings, SPEC, "img")
    meta = pod["metadata"]
    assert meta["name"] == "orchard-sb-1" and meta["namespace"] == "orchard-sandboxes"
    assert meta["labels"] == {"app.kubernetes.io/managed-by": "orchard", "orchard.dev/service": "orchard",
                              "orchard.dev/sandbox": "sb-1"}
    assert meta["annotations"] == {"orchard.dev/created-at": "1234.5", "orchard.dev/owner": "r1"}
    init, main = pod["spec"]["initContainers"][0], pod["spec"]["containers"][0]
    assert init["image"] == "orchard/agent:0.1.0" and main["image"] == "img"
    assert main["command"][:3] == [agent.PYTHON, "-I", "-c"] and "server" in main["command"][3]
    assert main["ports"] == [{"name": "orchard-agent", "containerPort": 7070, "protocol": "TCP"}]
    assert {"name": "orchard-agent", "mountPath": agent.HOME, "readOnly": True} in main["volumeMounts"]
    token_env = init["env"][0]
    assert token_env["valueFrom"]["secretKeyRef"] == {"name": "orchard-sb-1-token", "key": "token"}
    assert not any(e.get("valueFrom") for e in main["env"]), "the token must reach the init container only"
    assert pods.agent_port(pod, 1) == 7070 and pods.created_at(meta) == 1234.5


def test_manifests_are_valid_kubernetes_objects(settings):
    """The official client's models accept every object (field names and types as the API defines them)."""
    api = kube.ApiClient()
    for obj, model in ((pods.sandbox_pod(settings, SPEC, "img"), "V1Pod"),
                       (pods.token_secret(settings, SPEC, "t"), "V1Secret"),
                       (pods.default_deny_egress(settings), "V1NetworkPolicy"),
                       (pods.agent_ingress(settings), "V1NetworkPolicy"),
                       (pods.sandbox_egress(settings, SPEC), "V1NetworkPolicy")):
        parsed = api._ApiClient__deserialize(obj, model)
        assert api.sanitize_for_serialization(parsed)["metadata"]["name"] == obj["metadata"]["name"]


def test_default_deny_and_agent_ingress(settings):
    deny = pods.default_deny_egress(settings)["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Egress"], "egress": []}
    ingress = pods.agent_ingress(settings)["spec"]
    assert ingress["policyTypes"] == ["Ingress"]
    rule = ingress["ingress"][0]
    assert rule["ports"] == [{"protocol": "TCP", "port": 7070}]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "orchard"}},
                             "podSelector": {"matchLabels": {"app.kubernetes.io/name": "orchard-env"}}}]


def test_sandbox_egress_blocks_cluster_and_metadata_ranges(settings):
    policy = pods.sandbox_egress(settings, SPEC)
    assert policy["metadata"]["name"] == "orchard-sb-1-egress"
    assert policy["spec"]["podSelector"]["matchLabels"]["orchard.dev/sandbox"] == "sb-1"
    anywhere, dns = policy["spec"]["egress"]
    block = anywhere["to"][0]["ipBlock"]
    assert block["cidr"] == "0.0.0.0/0"
    for cidr in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "100.64.0.0/10"):
        assert cidr in block["except"]
    assert dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    assert {p["port"] for p in dns["ports"]} == {53}


def test_settings_refuse_bad_cidrs_and_labels(tmp_path):
    with pytest.raises(ValueError, match="IPv4 CIDR"):
        Settings(state_dir=tmp_path, kube_blocked_cidrs="10.0.0.0/8,fd00::/8")
    with pytest.raises(ValueError, match="IPv4 CIDR"):
        Settings(state_dir=tmp_path, kube_blocked_cidrs="not-a-cidr")
    with pytest.raises(ValueError, match="key=value"):
        Settings(state_dir=tmp_path, kube_service_labels="app")
    s = Settings(state_dir=tmp_path, kube_service_labels="app=env, tier=api")
    assert s.kube_service_labels == {"app": "env", "tier": "api"}


MODEL_SPEC = SandboxSpec("sb-1", "img", model_endpoint=(8000, "proxy.orchard.svc", 8300), created_at=1234.5)


def test_model_egress_allows_exactly_the_target_addresses_and_port(settings):
    policy = pods.model_egress(settings, MODEL_SPEC, ["10.1.2.3", "fd00::7"])
    assert policy["metadata"]["name"] == "orchard-sb-1-model"
    assert policy["metadata"]["labels"]["orchard.dev/sandbox"] == "sb-1"
    assert policy["spec"]["podSelector"]["matchLabels"]["orchard.dev/sandbox"] == "sb-1"
    assert policy["spec"]["policyTypes"] == ["Egress"]
    assert policy["spec"]["egress"] == [{"to": [{"ipBlock": {"cidr": "10.1.2.3/32"}},
                                                {"ipBlock": {"cidr": "fd00::7/128"}}],
                                         "ports": [{"protocol": "TCP", "port": 8300}]}]
    pod = pods.sandbox_pod(settings, MODEL_SPEC, "img", ["10.1.2.3", "fd00::7"])
    for obj in (policy, pod):
        kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)
    with pytest.raises(ValueError):
        pods.model_egress(settings, MODEL_SPEC, [])
    with pytest.raises(ValueError):
        pods.model_egress(settings, SPEC, ["10.1.2.3"])


def test_model_endpoint_reaches_the_agent_as_a_private_env(settings):
    main = pods.sandbox_pod(settings, MODEL_SPEC, "img", ["10.1.2.3", "fd00::7"])["spec"]["containers"][0]
    relay = [e for e in main["env"] if e["name"] == agent.RELAY_ENV]
    assert relay == [{"name": agent.RELAY_ENV, "value": "8000=10.1.2.3:8300,[fd00::7]:8300"}]
    assert agent.RELAY_ENV in agent.PRIVATE_ENV, "commands in the sandbox must not see it"
    plain = pods.sandbox_pod(settings, SPEC, "img")["spec"]["containers"][0]
    assert [e["name"] for e in plain["env"]] == [agent.PORT_ENV]
    assert main["terminationMessagePolicy"] == "FallbackToLogsOnError", "a relay that cannot start says why"
