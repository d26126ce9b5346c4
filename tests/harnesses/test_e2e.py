"""Each harness, the real binary in a closed local sandbox, driven through the recording proxy by a scripted model.

The task: create /workspace/hello.txt containing hello, then finish. Afterwards the proxy's records must
hold exactly what the model produced: every sample's completion decodes (SmolLM2 tokenizer) to a reply
the scripted model gave, its mask is 1 exactly on those tokens, and its prompt is the engine's prompt.
"""

from __future__ import annotations

from collections import Counter

import pytest

from orchard.errors import HarnessError
from orchard.harnesses import Budget, Endpoint, Launch, get_harness, run_harness
from orchard.harnesses.base import exit_outcome
from tests.harnesses.conftest import SANDBOX_PORT

INSTRUCTION = "Create the file /workspace/hello.txt containing the word hello, then finish."
HARNESSES = ["minimal", "mini-swe-agent", "opencode", "codex", "claude-code"]


@pytest.fixture(params=HARNESSES)
def harness(request, tools_dir):
    adapter = get_harness(request.param)
    if not adapter.installed(tools_dir):
        pytest.skip(f"{adapter.name} is not in the tools folder {tools_dir}: run `orchard harness install {adapter.name}`")
    return adapter


def open_session(proxy, harness) -> dict:
    reply = proxy["admin"].post("/sessions", json={"max_calls": 40, "metadata": {"harness": harness.name}})
    assert reply.status_code == 201, reply.text
    return reply.json()


def test_harness_creates_the_file_and_its_calls_are_recorded(harness, sandbox, proxy, policy, tokenizer):
    policy.reset()
    session = open_session(proxy, harness)
    endpoint = Endpoint.from_session(session, port=SANDBOX_PORT)
    result = run_harness(sandbox.client, sandbox, harness, endpoint, INSTRUCTION, Budget(max_steps=10, timeout_s=600))

    assert result.reason == "done", result
    assert sandbox.download_content("/workspace/hello.txt").decode().strip() == "hello"
    records = proxy["admin"].get(f"/sessions/{session['id']}/trajectories").json()
    samples = records["samples"]
    assert samples and len(samples) == len(policy.replies), (len(samples), len(policy.replies))
    produced = Counter(reply.text() + tokenizer.decode([tokenizer.end_of_turn_id]) for reply in policy.replies)
    recorded = Counter(tokenizer.decode(s["input_ids"][s["prompt_length"]:]) for s in samples)
    assert recorded == produced
    calls = {c["index"]: c for c in proxy["admin"].get(f"/sessions/{session['id']}/calls").json()}
    for sample in samples:
        n, engine = sample["prompt_length"], calls[sample["call_index"]]["reply"]
        assert sample["input_ids"][:n] == engine["prompt_token_ids"]                  # the engine's prompt, as it sent it
        assert sample["input_ids"][n:] == engine["choices"][0]["token_ids"]
        assert sample["loss_mask"] == [0] * n + [1] * (len(sample["input_ids"]) - n)
        assert len(sample["input_ids"]) > n > 0
    assert INSTRUCTION in tokenizer.decode(samples[0]["input_ids"][:samples[0]["prompt_length"]])
    assert {s["dialect"] for s in samples} == {harness.dialect}
    # every harness re-sends its whole history, so the calls stitch into one branch whose mask is 1 on each reply
    [trajectory] = records["trajectories"]
    assert trajectory["calls"] == list(range(len(samples)))
    assert sum(trajectory["loss_mask"]) == sum(len(s["input_ids"]) - s["prompt_length"] for s in samples)


def test_the_proxy_limit_ends_the_run_as_budget(harness, sandbox, proxy, policy):
    """One call allowed: the second gets the proxy's 4xx, the harness stops cleanly, the result says budget."""
    policy.reset()
    session = proxy["admin"].post("/sessions", json={"max_calls": 1}).json()
    endpoint = Endpoint.from_session(session, port=SANDBOX_PORT)
    result = run_harness(sandbox.client, sandbox, harness, endpoint, INSTRUCTION, Budget(max_steps=10, timeout_s=300))
    assert result.reason == "budget", result
    assert "limit" in result.detail and result.exit_code not in (0, 124)
    assert len(proxy["admin"].get(f"/sessions/{session['id']}/calls").json()) >= 1


@pytest.mark.parametrize("name", ["minimal", "claude-code"])
def test_the_harness_step_budget_ends_the_run_as_budget(name, tools_dir, sandbox, proxy, policy):
    """max_steps=1: the harness's own step limit stops it after the tool call, before it could finish."""
    adapter = get_harness(name)
    if not adapter.installed(tools_dir):
        pytest.skip(f"{name} is not installed in {tools_dir}")
    policy.reset()
    endpoint = Endpoint.from_session(open_session(proxy, adapter), port=SANDBOX_PORT)
    result = run_harness(sandbox.client, sandbox, adapter, endpoint, INSTRUCTION, Budget(max_steps=1, timeout_s=300))
    assert result.reason == "budget", result
    assert len(policy.replies) == 1 and policy.replies[0].tool_calls


def test_the_wall_clock_kills_a_stuck_harness_and_says_budget(sandbox):
    """A harness that never ends is killed at Budget.timeout_s (exit 124): a budget end, not an error."""
    class Stuck:
        name, dialect = "stuck", "openai_chat"

        def launch(self, instruction, endpoint, budget, workdir):
            return Launch(argv=["/bin/sleep", "600"], cwd=workdir)

        def outcome(self, exit_code, stdout, stderr, report=""):
            return exit_outcome(exit_code, stdout, stderr)

    endpoint = Endpoint(port=SANDBOX_PORT, key="k", base_urls={"openai_chat": "http://x/v1"})
    result = run_harness(sandbox.client, sandbox, Stuck(), endpoint, INSTRUCTION, Budget(timeout_s=2))
    assert (result.reason, result.exit_code) == ("budget", 124) and 1.5 < result.seconds < 60


def test_a_missing_harness_is_a_harness_error(sandbox, proxy):
    """A command that is not in the tools folder fails before the run with a HarnessError that says what to do."""
    class Absent:
        name, dialect = "absent", "openai_chat"

        def launch(self, instruction, endpoint, budget, workdir):
            return Launch(argv=["/opt/orchard/tools/bin/absent", instruction], cwd=workdir)

    endpoint = Endpoint(port=SANDBOX_PORT, key="k", base_urls={"openai_chat": "http://x/v1"})
    with pytest.raises(HarnessError, match="absent cannot start.*orchard harness install"):
        run_harness(sandbox.client, sandbox, Absent(), endpoint, INSTRUCTION)


def test_the_cli_runs_a_harness_in_an_existing_sandbox(service, sandbox, proxy, policy, tools_dir):
    """`orchard harness run` prints the HarnessResult as JSON and exits 0 when the harness is done."""
    import json
    import subprocess
    import sys

    if not get_harness("minimal").installed(tools_dir):
        pytest.skip("the minimal harness is not installed")
    policy.reset()
    session = open_session(proxy, get_harness("minimal"))
    done = subprocess.run([sys.executable, "-m", "orchard.cli", "harness", "run", "--harness", "minimal",
                           "--instruction", INSTRUCTION, "--sandbox", sandbox.sandbox_id, "--session", json.dumps(session),
                           "--port", str(SANDBOX_PORT), "--url", service.url, "--max-steps", "5"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["reason"] == "done"
    assert sandbox.download_content("/workspace/hello.txt") == b"hello\n"


async def test_the_async_twin_runs_a_harness(service, proxy, policy, tools_dir):
    """arun_harness with AsyncSandboxClient: same run, same result."""
    from orchard import AsyncSandboxClient
    from orchard.harnesses.run import arun_harness

    if not get_harness("minimal").installed(tools_dir):
        pytest.skip("the minimal harness is not installed")
    policy.reset()
    endpoint = Endpoint.from_session(open_session(proxy, get_harness("minimal")), port=SANDBOX_PORT)
    async with AsyncSandboxClient(base_url=service.url) as client:
        box = await client.create_sandbox("host", timeout=120, model_endpoint={
            "port": SANDBOX_PORT, "target": f"127.0.0.1:{proxy['port']}"})
        result = await arun_harness(client, box.sandbox_id, "minimal", endpoint, INSTRUCTION, Budget(max_steps=5))
        assert result.reason == "done" and result.harness == "minimal", result
        assert await box.download_content("/workspace/hello.txt") == b"hello\n"
