"""Recording end to end: multi-turn calls in every dialect stitch into exact trajectories, survive restarts and crashes,
and export to Parquet that Hugging Face `datasets` loads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx
import pytest

from orchard.proxy.bench import _free_port, _wait_healthy
from orchard.proxy.export import export
from orchard.proxy.fake_upstream import render_completion

TOOL_TURN = {"content": "Checking.", "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]}
FINAL_TURN = {"content": "Done: a.txt"}
CHAT_TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}]


def two_turns(upstream):
    """The model calls a tool on its first turn and answers on the second."""
    upstream.policy = lambda messages, tools: FINAL_TURN if messages[-1]["role"] == "tool" else TOOL_TURN


def chat_conversation(post):
    first = post("/v1/chat/completions", {"model": "m", "tools": CHAT_TOOLS, "messages": [{"role": "user", "content": "list"}]})
    message = first["choices"][0]["message"]
    history = [{"role": "user", "content": "list"}, message,
               {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "a.txt"}]
    post("/v1/chat/completions", {"model": "m", "tools": CHAT_TOOLS, "messages": history})


def responses_conversation(post):
    tools = [{"type": "function", "name": "bash", "parameters": {"type": "object", "properties": {}}}]
    first = post("/v1/responses", {"model": "m", "tools": tools, "input": "list"})
    call = first["output"][1]
    items = [{"role": "user", "content": "list"}, first["output"][0], call,
             {"type": "function_call_output", "call_id": call["call_id"], "output": "a.txt"}]
    post("/v1/responses", {"model": "m", "tools": tools, "input": items})


def anthropic_conversation(post):
    tools = [{"name": "bash", "input_schema": {"type": "object", "properties": {}}}]
    first = post("/v1/messages", {"model": "m", "max_tokens": 99, "tools": tools, "messages": [{"role": "user", "content": "list"}]})
    use = first["content"][1]
    history = [{"role": "user", "content": "list"}, {"role": "assistant", "content": first["content"]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "a.txt"}]}]
    post("/v1/messages", {"model": "m", "max_tokens": 99, "tools": tools, "messages": history})


def poster(proxy, session):
    def post(path, body):
        response = proxy.client.post(path, json=body, headers={"Authorization": f"Bearer {session['key']}"})
        assert response.status_code == 200, response.text
        return response.json()
    return post


@pytest.mark.parametrize("conversation", [chat_conversation, responses_conversation, anthropic_conversation])
def test_multi_turn_stitches_into_one_exact_trajectory(proxy, upstream, conversation):
    two_turns(upstream)
    session = proxy.open()
    conversation(poster(proxy, session))
    proxy.admin("POST", f"/sessions/{session['id']}/reward", json={"reward": 1.0})
    result = proxy.admin("GET", f"/sessions/{session['id']}/trajectories").json()
    [trajectory] = result["trajectories"]
    assert trajectory["calls"] == [0, 1] and trajectory["reward"] == 1.0
    sampled = bytes(t for t, m in zip(trajectory["input_ids"], trajectory["loss_mask"]) if m).decode()
    expected = render_completion("Checking.", TOOL_TURN["tool_calls"]) + render_completion("Done: a.txt", [])
    assert sampled == expected  # exactly what the upstream produced, nothing the harness or template added
    assert [bytes(s["input_ids"][s["prompt_length"]:]).decode() for s in result["samples"]] == [
        render_completion("Checking.", TOOL_TURN["tool_calls"]), render_completion("Done: a.txt", [])]


def test_sessions_and_calls_survive_a_restart(make_proxy, upstream, tmp_path):
    first = make_proxy()
    session = first.open(max_calls=3)
    post = poster(first, session)
    post("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    first.admin("POST", f"/sessions/{session['id']}/reward", json={"reward": 0.5})
    first.client.__exit__(None, None, None)
    with open(tmp_path / "store" / "calls.jsonl", "ab") as f:
        f.write(b'{"session_id": "torn')  # a crash mid-write
    second = make_proxy()
    post = poster(second, session)
    post("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "again"}]})
    view = second.admin("GET", f"/sessions/{session['id']}").json()
    assert [c["index"] for c in view["calls"]] == [0, 1] and view["reward"] == 0.5
    assert len(second.admin("GET", f"/sessions/{session['id']}/calls").json()) == 2
    post("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "third"}]})
    assert second.client.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
                              headers={"Authorization": f"Bearer {session['key']}"}).status_code == 400


def test_a_killed_proxy_loses_no_answered_call(upstream_server, upstream, tmp_path):
    port, store = _free_port(), tmp_path / "store"
    proc = subprocess.Popen([sys.executable, "-m", "orchard.proxy.bench", "proxy", str(port), upstream_server[1], str(store), "fsync"],
                            stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, proc)
        key = httpx.post(url + "/sessions", json={}, headers={"Authorization": "Bearer bench-admin"}).json()["key"]
        for i in range(5):
            assert httpx.post(url + "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": str(i)}]},
                              headers={"Authorization": f"Bearer {key}"}).status_code == 200
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    lines = (store / "calls.jsonl").read_text().splitlines()
    assert [json.loads(line)["index"] for line in lines] == [0, 1, 2, 3, 4]


def test_export_loads_with_hugging_face_datasets(proxy, upstream, tmp_path):
    datasets = pytest.importorskip("datasets")
    two_turns(upstream)
    session = proxy.open()
    chat_conversation(poster(proxy, session))
    upstream.token_ids = False
    text_session = proxy.open(text_only=True)
    poster(proxy, text_session)("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    proxy.admin("POST", f"/sessions/{session['id']}/reward", json={"reward": 1.0})
    counts = export(tmp_path / "store", tmp_path / "out")
    assert counts == {"sessions": 2, "calls": 3, "samples": 2, "trajectories": 1}
    sessions = datasets.load_dataset("parquet", data_files=str(tmp_path / "out" / "sessions.parquet"), split="train",
                                     cache_dir=str(tmp_path / "hf"))
    assert sorted(sessions["reward"], key=str) == [1.0, None] and sorted(sessions["calls"]) == [1, 2]
    trajectories = datasets.load_dataset("parquet", data_files=str(tmp_path / "out" / "trajectories.parquet"), split="train",
                                          cache_dir=str(tmp_path / "hf"))
    row = trajectories[0]
    assert row["calls"] == [0, 1] and row["reward"] == 1.0 and len(row["input_ids"]) == len(row["loss_mask"]) == len(row["logprobs"])
    calls = datasets.load_dataset("parquet", data_files=str(tmp_path / "out" / "calls.parquet"), split="train",
                                          cache_dir=str(tmp_path / "hf"))
    assert sorted(calls["text_only"]) == [False, False, True]
    text_row = [r for r in calls if r["text_only"]][0]
    assert json.loads(text_row["reply"])["choices"][0]["message"]["content"] == "Checking."




@pytest.mark.parametrize("durability", ["fsync", "flush"])
def test_an_unrecordable_call_is_not_answered(make_proxy, durability):
    proxy = make_proxy(durability=durability)
    session = proxy.open()
    recorder = proxy.client.app.state.proxy.recorder

    def full_disk(batch):
        raise OSError(28, "No space left on device")

    recorder._write = full_disk
    response = proxy.client.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
                                 headers={"Authorization": f"Bearer {session['key']}"})
    assert response.status_code == 500 and "could not record" in response.json()["error"]["message"]
    assert "choices" not in response.json()


def test_one_proxy_per_store(tmp_path):
    from orchard.errors import ConflictError
    from orchard.proxy.recorder import Recorder

    first = Recorder(tmp_path / "store")
    with pytest.raises(ConflictError, match="in use"):
        Recorder(tmp_path / "store")
    first.close()
    Recorder(tmp_path / "store").close()
