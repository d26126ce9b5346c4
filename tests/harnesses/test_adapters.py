"""The adapters without a sandbox: endpoints, launch lines, how each harness's end is judged, the tools folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from orchard.errors import HarnessError
from orchard.harnesses import HARNESSES, Budget, Endpoint, get_harness
from orchard.harnesses import minimal_agent, tools
from orchard.harnesses.base import RUN_DIR, TOOLS_MOUNT
from orchard.harnesses.minimal import Minimal

SESSION = {"id": "s_1", "key": "sk-session-123", "base_urls": {
    "openai_chat": "http://10.0.0.5:8090/sessions/s_1/v1", "openai_responses": "http://10.0.0.5:8090/sessions/s_1/v1",
    "anthropic_messages": "http://10.0.0.5:8090/sessions/s_1"}}
LIMIT_LINE = 'ERROR: {"error": {"message": "session s_1: call limit reached (1 calls); the session is over", "code": "session_limit_reached"}}'


@pytest.fixture
def endpoint() -> Endpoint:
    return Endpoint.from_session(SESSION, port=8000, model="m1")


def test_endpoint_points_at_the_sandbox_port_and_keeps_the_session_path(endpoint):
    assert endpoint.url("openai_chat") == "http://127.0.0.1:8000/sessions/s_1/v1"
    assert endpoint.url("anthropic_messages") == "http://127.0.0.1:8000/sessions/s_1"
    with pytest.raises(ValueError, match="no base URL for openai_responses"):
        Endpoint(port=8000, key="k", base_urls={"openai_chat": "http://h/v1"}).url("openai_responses")


def test_bad_budgets_and_unknown_harnesses_are_refused():
    with pytest.raises(ValueError):
        Budget(max_steps=0)
    with pytest.raises(HarnessError, match="Unknown harness 'nope'; known: codex, claude-code"):
        get_harness("nope")


@pytest.mark.parametrize("name", list(HARNESSES))
def test_launch_runs_from_the_tools_folder_against_the_session(name, endpoint):
    harness = HARNESSES[name]
    launch = harness.launch("make it so; don't stop", endpoint, Budget(max_steps=7), "/repo")
    assert launch.argv[0].startswith(f"{TOOLS_MOUNT}/bin/") and launch.cwd == "/repo"
    assert "make it so; don't stop" in launch.argv                        # one argv element, never shell-parsed
    assert not any(endpoint.key in a for a in launch.argv)                # the key travels in the environment or a file
    visible = " ".join(launch.argv) + json.dumps(launch.env) + json.dumps(launch.files)
    assert endpoint.key in visible and endpoint.url(harness.dialect) in visible
    assert "10.0.0.5" not in visible
    assert all(v.startswith(RUN_DIR) for k, v in launch.env.items() if k in ("HOME", "CODEX_HOME", "OPENCODE_CONFIG"))


def test_codex_runs_without_its_own_sandbox_against_a_responses_provider(endpoint):
    import tomllib

    launch = HARNESSES["codex"].launch("x", endpoint, Budget(), "/w")
    assert "--dangerously-bypass-approvals-and-sandbox" in launch.argv and "--skip-git-repo-check" in launch.argv
    config = tomllib.loads(launch.files[launch.env["CODEX_HOME"] + "/config.toml"])
    assert config["model_provider"] == "orchard" and config["model"] == "m1" and config["analytics"] == {"enabled": False}
    assert config["model_providers"]["orchard"] == {
        "name": "orchard", "base_url": endpoint.url("openai_responses"), "env_key": "ORCHARD_MODEL_KEY",
        "wire_api": "responses", "request_max_retries": 0, "stream_max_retries": 0}
    assert launch.env["ORCHARD_MODEL_KEY"] == endpoint.key


def test_opencode_config_declares_the_proxy_provider(endpoint):
    launch = HARNESSES["opencode"].launch("x", endpoint, Budget(max_steps=5), "/w")
    config = json.loads(launch.files[launch.env["OPENCODE_CONFIG"]])
    options = config["provider"]["orchard"]["options"]
    assert options == {"baseURL": endpoint.url("openai_chat"), "apiKey": endpoint.key}
    assert config["agent"]["build"]["steps"] == 5 and config["model"] == "orchard/m1"


@pytest.mark.parametrize("name, exit_code, stdout, stderr, reason", [
    ("codex", 0, "done\n", "", "done"),
    ("codex", 124, "", "", "budget"),
    ("codex", 1, "", LIMIT_LINE + "\ntokens used\n6,515\n", "budget"),
    ("codex", 1, "", "ERROR: unexpected status 500\n", "error"),
    ("opencode", 1, "", "Error: session s_1: token limit reached (10 of 10 sampled tokens)\n", "budget"),
    ("minimal", 0, '{"reason": "done", "steps": 2}\n', "", "done"),
    ("minimal", 3, '{"reason": "budget", "steps": 1}\n', "", "budget"),
    ("minimal", 1, '{"reason": "error", "steps": 1, "error": "HTTP 502: upstream down"}\n', "", "error"),
    ("minimal", 2, "", "usage: minimal_agent.py\n", "error"),
])
def test_outcomes_from_output(name, exit_code, stdout, stderr, reason):
    assert HARNESSES[name].outcome(exit_code, stdout, stderr, "")[0] == reason


def claude_result(**fields) -> str:
    return "noise\n" + json.dumps({"type": "result", "subtype": "success", "is_error": False, "num_turns": 2, **fields}) + "\n"


@pytest.mark.parametrize("stdout, reason", [
    (claude_result(), "done"),
    (claude_result(subtype="error_max_turns", is_error=True), "budget"),
    (claude_result(is_error=True, result="API Error: 400 session s_1 is limit_reached: call limit reached (1 calls)"), "budget"),
    (claude_result(is_error=True, result="API Error: 400 messages.1: bad"), "error"),
    ("not json at all\n", "error"),
])
def test_claude_code_outcome_from_its_json_result(stdout, reason):
    assert HARNESSES["claude-code"].outcome(0 if reason == "done" else 1, stdout, "", "")[0] == reason


@pytest.mark.parametrize("status, reason", [("Submitted", "done"), ("LimitsExceeded", "budget"), ("TimeExceeded", "budget"),
                                            ("RuntimeError", "error")])
def test_mini_swe_agent_outcome_from_its_trajectory(status, reason):
    report = json.dumps({"info": {"exit_status": status}, "messages": [{"role": "exit", "extra": {"exception_str": "boom"}}]})
    assert HARNESSES["mini-swe-agent"].outcome(0, "", "", report)[0] == reason
    assert HARNESSES["mini-swe-agent"].outcome(1, "", "Traceback ...\n", "")[0] == "error"   # no trajectory written


# ---------------------------------------------------------------- the minimal harness itself
def test_minimal_agent_tool_errors_go_back_to_the_model():
    assert minimal_agent.run_bash("not json", 5).startswith("error: the arguments must be a JSON object")
    assert minimal_agent.run_bash(json.dumps({"command": "echo hi; exit 3"}), 5) == "exit code: 3\nhi\n"
    assert "timed out" in minimal_agent.run_bash(json.dumps({"command": "sleep 5"}), 0.2)


def test_minimal_agent_refuses_bad_arguments_and_reports_an_unreachable_model(capsys):
    with pytest.raises(SystemExit) as stop:
        minimal_agent.main(["--base-url", "http://127.0.0.1:9/v1", "--max-steps", "0", "task"])
    assert stop.value.code == 2
    assert minimal_agent.main(["--base-url", "http://127.0.0.1:9/v1", "--model-timeout", "5", "task"]) == 1
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["reason"] == "error" and "Connection refused" in summary["error"]


# ---------------------------------------------------------------- the tools folder
def test_install_tree_is_idempotent_atomic_and_relocatable(tmp_path):
    calls = []

    def fill(tmp):
        calls.append(tmp)
        (tmp / "run.sh").write_text("#!/bin/sh\necho ran\n")
        (tmp / "run.sh").chmod(0o755)

    for _ in range(2):
        tools.install_tree(tmp_path / "t", "demo", "demo==1", fill, {"demo": "run.sh"})
    assert len(calls) == 1 and tools.is_installed(tmp_path / "t", "demo", "demo==1")
    assert os.readlink(tmp_path / "t" / "bin" / "demo") == "../demo/run.sh"          # relative: works at /opt/orchard/tools
    os.rename(tmp_path / "t", tmp_path / "moved")
    assert subprocess.run([tmp_path / "moved" / "bin" / "demo"], capture_output=True, text=True).stdout == "ran\n"
    tools.install_tree(tmp_path / "moved", "demo", "demo==2", fill, {"demo": "run.sh"})   # a new pin reinstalls
    assert len(calls) == 2 and not any(p.name.startswith((".tmp-", ".old-")) for p in (tmp_path / "moved").iterdir())


def test_a_failed_install_leaves_nothing_half_done(tmp_path):
    def fill(tmp):
        (tmp / "partial").write_text("x")
        tools.run([sys.executable, "-c", "import sys; print('no such package', file=sys.stderr); sys.exit(1)"], "pip install x")

    with pytest.raises(HarnessError, match="pip install x failed .exit 1.: no such package"):
        tools.install_tree(tmp_path, "broken", "broken==1", fill, {"broken": "partial"})
    assert not (tmp_path / "broken").exists() and not tools.is_installed(tmp_path, "broken", "broken==1")


def test_npm_missing_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(tools.shutil, "which", lambda name: None)
    with pytest.raises(HarnessError, match="needs npm"):
        tools.npm_fill("@openai/codex", "0.0.1")(tmp_path)


def test_the_minimal_harness_installs_and_runs_from_the_tools_folder(tmp_path):
    Minimal().install(tmp_path)
    assert Minimal().installed(tmp_path)
    done = subprocess.run([tmp_path / "bin" / "orchard-minimal", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--max-steps" in done.stdout


def test_cli_install_list_and_errors(tmp_path):
    def orchard(*args):
        return subprocess.run([sys.executable, "-m", "orchard.cli", "harness", *args], capture_output=True, text=True)

    done = orchard("install", "minimal", "--tools-dir", str(tmp_path))
    assert done.returncode == 0 and "minimal: installed" in done.stdout
    assert "minimal: already installed" in orchard("install", "minimal", "--tools-dir", str(tmp_path)).stdout
    listing = orchard("list", "--tools-dir", str(tmp_path)).stdout
    assert "minimal          openai_chat          installed" in listing and "codex            openai_responses     not installed" in listing
    bad = orchard("install", "nosuch", "--tools-dir", str(tmp_path))
    assert bad.returncode == 2 and "Unknown harness 'nosuch'" in bad.stderr

    bad = orchard("run", "--harness", "minimal", "--instruction", "x", "--sandbox", "s", "--session", "{not json", "--port", "1")
    assert bad.returncode == 2 and "--session must be the proxy's POST /sessions reply" in bad.stderr
