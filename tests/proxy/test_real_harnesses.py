"""The real Codex CLI, Claude Code and OpenCode binaries drive the proxy (a real uvicorn process) on a small task;
their calls stitch into a main branch and every sample decodes to exactly what the upstream produced.

Slow, and skipped unless the binaries are found (ORCHARD_HARNESS_BIN, PATH, ~/.cache/orchard/tools/bin)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import httpx
import pytest

from orchard.proxy.bench import _free_port, _wait_healthy
from orchard.proxy.fake_upstream import render_completion

pytestmark = pytest.mark.slow
ADMIN = "bench-admin"
WRITE = "echo hello > hello.txt"


def binary(name: str) -> str:
    """ORCHARD_HARNESS_BIN, else PATH, else the tools folder the harness adapters install into."""
    folders = [os.environ.get("ORCHARD_HARNESS_BIN"), os.environ.get("PATH"), os.path.expanduser("~/.cache/orchard/tools/bin")]
    found = shutil.which(name, path=os.pathsep.join(f for f in folders if f))
    if not found:
        pytest.skip(f"{name} not found (set ORCHARD_HARNESS_BIN to a folder holding it)")
    return found


def policy_for(decisions: list[dict]):
    """Write the file with whatever shell tool the harness offers (slowly), then finish."""
    def policy(messages, tools):
        names = {t["function"]["name"] for t in tools or []}
        if messages[-1]["role"] == "tool":
            decision = {"content": "Done."}
        elif "exec_command" in names:
            decision = {"content": None, "tool_calls": [{"name": "exec_command", "arguments": {"cmd": WRITE}}]}
        elif names & {"Bash", "bash"}:
            name = "Bash" if "Bash" in names else "bash"
            decision = {"content": "Writing.", "tool_calls": [{"name": name, "arguments": {"command": WRITE, "description": "write"}}]}
        else:
            decision = {"content": "A title"}
        decisions.append(decision)
        # the tool call takes longer than the proxy's 5 s keep-alive interval: the harness must accept the comments
        return decision | {"delay": 6.0} if decision.get("tool_calls") else decision
    return policy


@pytest.fixture
def live_proxy(upstream_server, upstream, tmp_path):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "orchard.proxy.bench", "proxy", str(port), upstream_server[1],
                             str(tmp_path / "store"), "fsync"], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    _wait_healthy(url, proc)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def codex(session, workdir, home):
    config = (f'model_providers.orchard={{name="orchard",base_url="{session["base_urls"]["openai_responses"]}",'
              'env_key="ORCHARD_KEY",wire_api="responses"}')
    return ([binary("codex"), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
             "-c", "model_provider=orchard", "-c", config, "-m", "m", "create hello.txt containing hello"],
            {"ORCHARD_KEY": session["key"], "CODEX_HOME": str(home)})


def claude(session, workdir, home):
    return ([binary("claude"), "-p", "create hello.txt containing hello", "--dangerously-skip-permissions"],
            {"ANTHROPIC_BASE_URL": session["base_urls"]["anthropic_messages"], "ANTHROPIC_API_KEY": session["key"],
             "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "IS_SANDBOX": "1"})


def opencode(session, workdir, home):
    provider = {"npm": "@ai-sdk/openai-compatible", "name": "orchard", "models": {"m": {"name": "m", "tool_call": True}},
                "options": {"baseURL": session["base_urls"]["openai_chat"], "apiKey": session["key"]}}
    (workdir / "opencode.json").write_text(json.dumps({"provider": {"orchard": provider}, "model": "orchard/m",
                                                       "autoupdate": False, "share": "disabled"}))
    return [binary("opencode"), "run", "--model", "orchard/m", "create hello.txt containing hello"], {}


@pytest.mark.parametrize("harness", [codex, claude, opencode])
def test_real_harness_through_the_proxy(live_proxy, upstream, tmp_path, harness):
    decisions: list[dict] = []
    upstream.policy = policy_for(decisions)
    admin = {"Authorization": f"Bearer {ADMIN}"}
    session = httpx.post(live_proxy + "/sessions", json={}, headers=admin).json()
    workdir, home = tmp_path / "work", tmp_path / "home"
    workdir.mkdir()
    home.mkdir()
    command, env = harness(session, workdir, home)
    base = os.environ | {"HOME": str(home), "PWD": str(workdir)}  # OpenCode takes its project folder from $PWD
    run = subprocess.run(command, cwd=workdir, env=base | env, timeout=300, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:] + _logs(home)
    assert (workdir / "hello.txt").read_text() == "hello\n"
    result = httpx.get(f"{live_proxy}/sessions/{session['id']}/trajectories", headers=admin).json()
    main = max(result["trajectories"], key=lambda t: len(t["calls"]))
    assert len(main["calls"]) == 2 and not main["ambiguous"]
    texts = [render_completion(d.get("content") or "", d.get("tool_calls") or []) for d in decisions]
    assert bytes(t for t, m in zip(main["input_ids"], main["loss_mask"]) if m).decode() == "".join(
        text for text, d in zip(texts, decisions) if d.get("tool_calls") or d["content"] == "Done.")
    # side calls (OpenCode's title) may be abandoned when the harness exits; whatever was recorded is exact
    assert {bytes(s["input_ids"][s["prompt_length"]:]).decode() for s in result["samples"]} <= set(texts)


def _logs(home) -> str:
    return "".join(p.read_text()[-3000:] for p in home.rglob("*.log"))
