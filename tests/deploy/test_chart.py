"""The Helm chart renders (Helm's engine), validates against the Kubernetes schemas and keeps its security properties."""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import kubernetes_validate
import pytest

from orchard.env.backends import kubernetes_pods
from orchard.env.settings import Settings
from tests.deploy.conftest import CHART, KEYS, container_env, find, helm, one, render

KUBE_VERSIONS = ["1.29.0", "1.33.0", kubernetes_validate.latest_version()]
POD_OWNERS = ("Deployment", "StatefulSet")
BACKENDS = Path(kubernetes_pods.__file__).parent
SANDBOX_LABELS = {"app.kubernetes.io/managed-by": "orchard", "orchard.dev/sandbox": "sbx-1"}


def selects(selector: dict, labels: dict) -> bool:
    """Whether a matchLabels selector picks a pod with these labels."""
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def pod_labels(objects: list[dict], kind: str) -> dict:
    return one(objects, kind)["spec"]["template"]["metadata"]["labels"]


def with_values(**extra: object) -> dict:
    return {**copy.deepcopy(KEYS), **extra}


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_every_object_validates_against_the_kubernetes_schema(objects, version):
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_validator_rejects_a_broken_object(objects):
    broken = copy.deepcopy(one(objects, "Deployment"))
    broken["spec"]["replicas"] = "three"
    broken["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy2"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBE_VERSIONS[-1], strict=True)


def test_helm_lint_reports_no_warning_or_error():
    report = helm.lint(str(CHART), KEYS, strict=True, namespace="default")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_objects_land_in_the_two_namespaces_with_pod_security_labels(objects):
    namespaces = {n["metadata"]["name"]: n["metadata"]["labels"] for n in find(objects, "Namespace")}
    assert namespaces["orchard"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert namespaces["orchard-sandboxes"]["pod-security.kubernetes.io/enforce"] == "baseline"
    cluster_scoped = ("Namespace", "ClusterRole", "ClusterRoleBinding")
    placed = {o["metadata"].get("namespace") for o in objects if o["kind"] not in cluster_scoped}
    assert placed == {"orchard", "orchard-sandboxes"}


def test_the_service_runs_replicas_on_kubernetes_and_redis_with_health_probes(objects):
    deployment = one(objects, "Deployment")
    env = container_env(deployment)
    assert deployment["spec"]["replicas"] == 3
    assert env["ORCHARD_BACKEND"]["value"] == "kubernetes" and env["ORCHARD_STORE"]["value"] == "redis"
    assert env["ORCHARD_REPLICA_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    pdb = one(objects, "PodDisruptionBudget")
    assert selects(pdb["spec"]["selector"], pod_labels(objects, "Deployment"))
    service = one(objects, "Service", "orchard")
    assert service["spec"]["type"] == "ClusterIP"
    assert selects({"matchLabels": service["spec"]["selector"]}, pod_labels(objects, "Deployment"))


def test_one_replica_gets_no_disruption_budget():
    assert find(render(with_values(replicas=1)), "PodDisruptionBudget") == []


@pytest.mark.parametrize("kind", POD_OWNERS)
def test_pods_are_unprivileged_non_root_and_limited(objects, kind):
    pod = one(objects, kind)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    assert not any("hostPath" in v for v in pod.get("volumes", []))
    for container in pod["containers"] + pod.get("initContainers", []):
        sc = container["securityContext"]
        assert sc.get("privileged", False) is False
        assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert {"cpu", "memory"} <= set(container["resources"]["limits"])
        assert {"cpu", "memory"} <= set(container["resources"]["requests"])


def test_only_the_service_pods_get_a_service_account_token(objects):
    assert one(objects, "Deployment")["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    assert one(objects, "StatefulSet")["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_sandbox_namespace_denies_all_traffic_by_default(objects):
    for name, kind in (("orchard-default-deny-egress", "Egress"), ("orchard-default-deny-ingress", "Ingress")):
        deny = one(objects, "NetworkPolicy", name)
        assert deny["metadata"]["namespace"] == "orchard-sandboxes"
        assert deny["spec"]["podSelector"] == {} and deny["spec"]["policyTypes"] == [kind]
        assert not deny["spec"].get("ingress") and not deny["spec"].get("egress")


def test_the_chart_ships_the_policies_the_backend_would_make(objects, monkeypatch):
    """Same names and rules as the backend's own (it creates them at start when missing), so they never conflict."""
    settings = _settings_from(objects, monkeypatch)
    for made in (kubernetes_pods.default_deny_egress(settings), kubernetes_pods.agent_ingress(settings)):
        shipped = one(objects, "NetworkPolicy", made["metadata"]["name"])
        assert shipped["metadata"]["namespace"] == made["metadata"]["namespace"]
        assert {k: v for k, v in shipped["spec"].items() if v} == {k: v for k, v in made["spec"].items() if v}


def test_only_the_service_pods_reach_the_agent_port(objects):
    policy = one(objects, "NetworkPolicy", "orchard-agent-ingress")
    assert policy["metadata"]["namespace"] == "orchard-sandboxes"
    assert selects(policy["spec"]["podSelector"], SANDBOX_LABELS)
    [rule] = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 7070}]
    [peer] = rule["from"]
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "orchard"}}
    assert selects(peer["podSelector"], pod_labels(objects, "Deployment"))
    assert not selects(peer["podSelector"], pod_labels(objects, "StatefulSet"))


def test_the_backend_is_told_the_same_service_labels_the_policy_uses(objects):
    env = container_env(one(objects, "Deployment"))
    told = dict(pair.split("=", 1) for pair in env["ORCHARD_KUBE_SERVICE_LABELS"]["value"].split(","))
    peer = one(objects, "NetworkPolicy", "orchard-agent-ingress")["spec"]["ingress"][0]["from"][0]
    assert told == peer["podSelector"]["matchLabels"]
    assert env["ORCHARD_KUBE_NAMESPACE"]["value"] == "orchard-sandboxes"
    assert env["ORCHARD_KUBE_SERVICE_NAMESPACE"]["value"] == "orchard"


def test_redis_takes_connections_from_the_service_pods_only(objects):
    policy = one(objects, "NetworkPolicy", "orchard-redis")
    assert selects(policy["spec"]["podSelector"], pod_labels(objects, "StatefulSet"))
    assert not selects(policy["spec"]["podSelector"], pod_labels(objects, "Deployment"))
    [rule] = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]
    [peer] = rule["from"]
    assert set(peer) == {"podSelector"}
    assert selects(peer["podSelector"], pod_labels(objects, "Deployment"))


def test_the_api_port_is_the_only_way_into_the_service_pods(objects):
    policy = one(objects, "NetworkPolicy", "orchard-api")
    assert selects(policy["spec"]["podSelector"], pod_labels(objects, "Deployment"))
    assert [r["ports"] for r in policy["spec"]["ingress"]] == [[{"protocol": "TCP", "port": 8080}]]
    peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}]
    limited = one(render(with_values(networkPolicy={"enabled": True, "apiFrom": peers})), "NetworkPolicy", "orchard-api")
    assert limited["spec"]["ingress"][0]["from"] == peers


def backend_calls() -> set[tuple[str, str, bool]]:
    """(resource, verb, namespaced) of every Kubernetes API call in the backend's code."""
    plural = {"pod": "pods", "secret": "secrets", "network_policy": "networkpolicies", "node": "nodes",
              "namespace": "namespaces"}
    verbs = {"read": "get", "create": "create", "list": "list", "delete": "delete", "patch": "patch", "replace": "update"}
    calls = set()
    for path in BACKENDS.glob("kubernetes*.py"):
        code = path.read_text()
        for verb, scoped, name in re.findall(r"(?:core|networking)\.(create|read|list|delete|patch|replace)_(namespaced_)?(\w+)", code):
            assert name in plural, f"{path.name} calls {verb}_{scoped}{name}: add it to the chart's RBAC and to this map"
            calls.add((plural[name], verbs[verb], bool(scoped)))
        for name in re.findall(r"\.stream\(\s*self\.core\.list_namespaced_(\w+)", code):
            calls.add((plural[name], "watch", True))
    return calls


def grants(role: dict) -> set[tuple[str, str]]:
    return {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}


def test_rbac_grants_exactly_what_the_backend_calls_in_the_sandbox_namespace(objects):
    needed = backend_calls()
    assert ("pods", "watch", True) in needed and ("pods", "create", True) in needed, "the scan found the calls"
    role = one(objects, "Role")
    assert role["metadata"]["namespace"] == "orchard-sandboxes"
    assert all("*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"] for rule in role["rules"])
    assert grants(role) == {(r, v) for r, v, namespaced in needed if namespaced}
    binding = one(objects, "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    [subject] = binding["subjects"]
    account = one(objects, "ServiceAccount")
    assert (subject["name"], subject["namespace"]) == (account["metadata"]["name"], account["metadata"]["namespace"])
    assert one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == subject["name"]


def test_cluster_wide_the_service_reads_only_its_sandbox_namespace(objects):
    cluster = {(r, v) for r, v, namespaced in backend_calls() if not namespaced}
    [rule] = one(objects, "ClusterRole")["rules"]
    assert rule["resourceNames"] == ["orchard-sandboxes"] and grants({"rules": [rule]}) == {("namespaces", "get")}
    assert cluster <= {("namespaces", "get"), ("nodes", "list")}, "the backend tolerates a 403 on nodes only"
    read_nodes = one(render(with_values(rbac={"readNodes": True})), "ClusterRole")
    assert grants(read_nodes) == {("namespaces", "get"), ("nodes", "list")}
    [subject] = one(objects, "ClusterRoleBinding")["subjects"]
    assert subject["name"] == one(objects, "ServiceAccount")["metadata"]["name"]


def test_redis_requires_a_password_and_keeps_an_append_only_file(objects):
    redis = one(objects, "StatefulSet")
    container = redis["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    assert args[args.index("--appendonly") + 1] == "yes" and args[args.index("--appendfsync") + 1] == "everysec"
    secret_ref = {e["name"]: e for e in container["env"]}["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
    password = one(objects, "Secret", secret_ref["name"])["stringData"][secret_ref["key"]]
    assert re.fullmatch(r"[A-Za-z0-9]{32}", password)
    assert container["volumeMounts"] == [{"name": "data", "mountPath": "/data"}]
    assert redis["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"


def test_the_service_reaches_redis_with_the_password_from_the_secret(objects):
    env = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    names = [e["name"] for e in env]
    assert names.index("REDIS_PASSWORD") < names.index("ORCHARD_REDIS_URL"), "$(VAR) expands only earlier variables"
    url = {e["name"]: e for e in env}["ORCHARD_REDIS_URL"]["value"]
    assert url == "redis://:$(REDIS_PASSWORD)@orchard-redis.orchard.svc:6379/0"
    assert one(objects, "Service", "orchard-redis")["spec"]["ports"][0]["port"] == 6379


def test_a_given_redis_password_is_used():
    secret = one(render(with_values(redis={"password": "S3cret"})), "Secret", "orchard-redis")
    assert secret["stringData"]["redis-password"] == "S3cret"


def test_an_external_redis_comes_from_a_secret_and_no_redis_runs():
    objects = render(with_values(redis={"enabled": False, "external": {"url": "rediss://:pw@redis.example:6380/2"}}))
    assert find(objects, "StatefulSet") == [] and find(objects, "NetworkPolicy", "orchard-redis") == []
    ref = container_env(one(objects, "Deployment"))["ORCHARD_REDIS_URL"]["valueFrom"]["secretKeyRef"]
    assert one(objects, "Secret", ref["name"])["stringData"][ref["key"]] == "rediss://:pw@redis.example:6380/2"


def test_api_keys_come_from_a_secret(objects):
    env = container_env(one(objects, "Deployment"))
    ref = env["ORCHARD_API_KEYS"]["valueFrom"]["secretKeyRef"]
    secret = one(objects, "Secret", ref["name"])
    assert secret["stringData"]["api-keys"] == "key-a" and secret["stringData"]["admin-keys"] == "admin-b"
    mine = render({"apiKeys": {"existingSecret": "my-keys"}})
    assert find(mine, "Secret", "orchard-api-keys") == []
    assert container_env(one(mine, "Deployment"))["ORCHARD_API_KEYS"]["valueFrom"]["secretKeyRef"]["name"] == "my-keys"


def test_every_orchard_variable_the_chart_sets_is_a_setting(objects):
    settings = {f"ORCHARD_{name.upper()}" for name in Settings.model_fields}
    for kind in POD_OWNERS:
        for container in one(objects, kind)["spec"]["template"]["spec"]["containers"]:
            names = {e["name"] for e in container.get("env", []) if e["name"].startswith("ORCHARD_")}
            assert names <= settings, f"not settings: {sorted(names - settings)}"


def _settings_from(objects: list[dict], monkeypatch) -> Settings:
    """Settings as a service pod would build them from the rendered environment (Secrets filled in)."""
    for name in [n for n in os.environ if n.startswith("ORCHARD_")]:
        monkeypatch.delenv(name)
    for name, entry in container_env(one(objects, "Deployment")).items():
        value = entry.get("value", {"ORCHARD_REPLICA_ID": "orchard-0", "ORCHARD_API_KEYS": "key-a"}.get(name, "x"))
        monkeypatch.setenv(name, value.replace("$(REDIS_PASSWORD)", "pw"))
    return Settings()


def test_the_rendered_environment_is_accepted_by_settings(objects, monkeypatch):
    settings = _settings_from(objects, monkeypatch)
    assert settings.backend == "kubernetes" and settings.store == "redis" and settings.port == 8080
    assert settings.api_keys == ["key-a"] and settings.redis_url.startswith("redis://:pw@")
    assert settings.kube_service_labels.items() <= pod_labels(objects, "Deployment").items()


def test_the_env_map_sets_any_setting_and_wins():
    env = container_env(one(render(with_values(env={"ORCHARD_MAX_SANDBOXES": 10, "ORCHARD_EXEC_TIMEOUT": "5"})),
                            "Deployment"))
    assert env["ORCHARD_MAX_SANDBOXES"]["value"] == "10" and env["ORCHARD_EXEC_TIMEOUT"]["value"] == "5"


def test_first_class_kube_values_reach_the_backend():
    kube = {"blockedCidrs": ["10.0.0.0/8", "169.254.169.254/32"], "imagePullSecrets": ["regcred"],
            "runtimeClass": "gvisor", "nodeSelector": {"pool": "sandboxes"}, "agentPort": 7171}
    objects = render(with_values(kube=kube))
    env = {k: v["value"] for k, v in container_env(one(objects, "Deployment")).items() if "value" in v}
    assert env["ORCHARD_KUBE_BLOCKED_CIDRS"] == "10.0.0.0/8,169.254.169.254/32"
    assert env["ORCHARD_KUBE_IMAGE_PULL_SECRETS"] == "regcred"
    assert env["ORCHARD_KUBE_RUNTIME_CLASS"] == "gvisor" and env["ORCHARD_KUBE_NODE_SELECTOR"] == "pool=sandboxes"
    assert env["ORCHARD_KUBE_AGENT_PORT"] == "7171"
    policy = one(objects, "NetworkPolicy", "orchard-agent-ingress")
    assert policy["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 7171}]


def test_a_load_balancer_and_an_ingress_render_valid_objects():
    objects = render(with_values(
        service={"type": "LoadBalancer", "port": 443, "loadBalancerSourceRanges": ["203.0.113.0/24"]},
        ingress={"enabled": True, "className": "nginx", "host": "orchard.example.com", "tlsSecretName": "orchard-tls"}))
    service = one(objects, "Service", "orchard")
    assert service["spec"]["type"] == "LoadBalancer" and service["spec"]["loadBalancerSourceRanges"] == ["203.0.113.0/24"]
    ingress = one(objects, "Ingress")
    assert ingress["spec"]["tls"] == [{"hosts": ["orchard.example.com"], "secretName": "orchard-tls"}]
    for obj in objects:
        kubernetes_validate.validate(obj, KUBE_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("values, namespace, message", [
    ({}, "default", "apiKeys.keys is empty"),
    (with_values(env={"MAX_SANDBOXES": "1"}), "default", "'MAX_SANDBOXES' does not match pattern '^ORCHARD_[A-Z0-9_]+$'"),
    (with_values(env={"ORCHARD_API_KEYS": "k"}), "default", "is set by the chart"),
    (with_values(env={"ORCHARD_NO_AUTH": "true"}), "default", "auth cannot be switched off"),
    (KEYS, "orchard", "cannot live in \"orchard\""),
    (with_values(redis={"password": "p@ss:word"}), "default", "at '/redis/password': 'p@ss:word' does not match"),
    (with_values(redis={"enabled": False}), "default", "set redis.external.url"),
    (with_values(redis={"appendfsync": "no"}), "default", "at '/redis/appendfsync': value must be one of"),
    (with_values(replica=3), "default", "additional properties 'replica' not allowed"),
    (with_values(replicas="three"), "default", "at '/replicas': got string, want integer"),
    (with_values(kube={"agentPort": 70000}), "default", "at '/kube/agentPort'"),
])
def test_bad_values_fail_with_a_clear_message(values, namespace, message):
    with pytest.raises(helm.HelmError, match=re.escape(message)):
        render(values, namespace=namespace)


def test_every_value_in_values_yaml_has_a_comment():
    lines = (CHART / "values.yaml").read_text().splitlines()
    for number, line in enumerate(lines):
        if re.match(r"\s*[A-Za-z][\w-]*:", line):
            above = lines[number - 1].strip()
            assert above.startswith("#"), f"values.yaml line {number + 1} ({line.strip()}) has no comment above it"


def test_namespaces_made_by_hand_let_the_release_live_in_the_service_namespace():
    objects = render(with_values(namespaces={"create": False}), namespace="orchard")
    assert find(objects, "Namespace") == []
    assert one(objects, "Deployment")["metadata"]["namespace"] == "orchard"
    for obj in objects:
        kubernetes_validate.validate(obj, KUBE_VERSIONS[-1], strict=True)
