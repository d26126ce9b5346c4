"""A SIGKILLed service loses nothing: sandboxes, reported results, and honest failures for interrupted jobs."""

from __future__ import annotations

import httpx

from orchard import SandboxClient
from orchard.env.runner import ServiceProcess

from .conftest import KEY_A, service_env


def test_sigkill_and_restart(tmp_path, model_server):
    state = tmp_path / "state"
    env = service_env(model_server)
    svc = ServiceProcess(state_dir=state, env=env, args=[]).start()
    client = SandboxClient(base_url=svc.url, api_key=KEY_A, auto_cleanup=False)
    sb = client.create_sandbox("host")
    done = sb.exec("echo before > /workspace/f; echo reported")
    http = httpx.Client(base_url=svc.url, headers={"X-API-Key": KEY_A}, timeout=30)
    running = http.post(f"/sandboxes/{sb.sandbox_id}/exec", json={"command": "sleep 60"}).json()["job_id"]
    http.get(f"/jobs/{running}/wait", params={"timeout": 0.5})
    svc.kill()

    svc2 = ServiceProcess(state_dir=state, env=env, args=[], port=svc.port).start()
    try:
        assert http.get(f"/jobs/{done.job_id}").json()["stdout"] == "reported\n"
        lost = http.get(f"/jobs/{running}").json()
        assert lost["status"] == "failed" and "restarted" in lost["error"]
        assert http.get(f"/sandboxes/{sb.sandbox_id}").json()["status"] == "ready"
        again = sb.exec("cat /workspace/f")
        assert again.stdout == "before\n", again
    finally:
        sb.delete()
        client.close()
        http.close()
        svc2.stop()
