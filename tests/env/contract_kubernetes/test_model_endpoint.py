"""model_endpoint on the Kubernetes backend through the real service: what holds where a NetworkPolicy is pod-wide.

The shared test_model_endpoint_reaches_only_its_target also asserts that the sandbox cannot open
the target itself directly. On Kubernetes it can: the relay runs in the agent, a process of the
pod, and the NetworkPolicy that lets the agent reach the target's address and port lets the whole
pod reach them (the fake's network emulates that faithfully, and the first test checks it). What
holds, and is checked here: the loopback port reaches the model, and nothing but the target is reachable.
"""

from __future__ import annotations

from tests.env.contract.conftest import IMAGE

FETCH = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8000/v1', timeout=10).read().decode())"
CONNECT = "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 3); print('connected')"


def test_model_endpoint_reaches_its_target_and_nothing_else(client, model_server, service):
    with client.create_sandbox(IMAGE, model_endpoint={"port": 8000, "target": f"127.0.0.1:{model_server}"}) as sb:
        r = sb.exec(["python3", "-c", FETCH])
        assert r.stdout.strip() == "model-endpoint-ok", r.stderr
        service_port = service.url.rsplit(":", 1)[1]
        other = sb.exec(["python3", "-c", CONNECT, service_port])
        assert other.exit_code != 0 and "connected" not in other.stdout
        assert "ORCHARD_AGENT" not in sb.exec("env").stdout
        # what the shared test forbids and a pod-wide NetworkPolicy cannot: checked so the skip reason stays true
        direct = sb.exec(["python3", "-c", CONNECT, str(model_server)])
        assert direct.exit_code == 0 and "connected" in direct.stdout


def test_two_sandboxes_use_the_same_port(client, model_server):
    """Each pod has its own loopback: the same model_endpoint port in two sandboxes at once."""
    endpoint = {"port": 8000, "target": f"127.0.0.1:{model_server}"}
    with client.create_sandbox(IMAGE, model_endpoint=endpoint) as a, \
            client.create_sandbox(IMAGE, model_endpoint=endpoint) as b:
        for sb in (a, b):
            assert sb.exec(["python3", "-c", FETCH]).stdout.strip() == "model-endpoint-ok"
