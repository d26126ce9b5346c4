"""The scripted model server over HTTP: the wire shape every engine shares, scripts, policies, bad input."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from orchard.errors import RequestError
from orchard.inference.api import create_app
from orchard.inference.scripted import Reply, Script, ScriptedEngine, load_policy, load_script

from .conftest import TOOLS

CALL = {"name": "bash", "arguments": {"command": "echo hello > /workspace/hello.txt"}}


def _client(tokenizer, **kwargs) -> TestClient:
    return TestClient(create_app(ScriptedEngine(tokenizer, **kwargs)))


def _ask(client, content="Say hi.", **extra):
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "logprobs": True,
            "return_token_ids": True, **extra}
    return client.post("/v1/chat/completions", json=body)


def test_reply_shape_ids_and_logprobs_aligned(tokenizer):
    client = _client(tokenizer, script=Script(replies=["Hello there!"]))
    reply = _ask(client).json()
    choice = reply["choices"][0]
    assert reply["object"] == "chat.completion" and choice["finish_reason"] == "stop"
    assert choice["message"] == {"role": "assistant", "content": "Hello there!", "tool_calls": None}
    assert reply["prompt_token_ids"] == tokenizer.prompt_ids([{"role": "user", "content": "Say hi."}])
    assert tokenizer.decode(choice["token_ids"]) == "Hello there!<|im_end|>"
    assert choice["token_ids"][-1] == tokenizer.end_of_turn_id
    content = choice["logprobs"]["content"]
    assert len(content) == len(choice["token_ids"]) and all(e["logprob"] == 0.0 for e in content)
    assert "".join(e["token"] for e in content) == "Hello there!<|im_end|>"
    assert reply["usage"] == {"prompt_tokens": len(reply["prompt_token_ids"]),
                              "completion_tokens": len(choice["token_ids"]),
                              "total_tokens": len(reply["prompt_token_ids"]) + len(choice["token_ids"])}


def test_tool_calls_are_rendered_in_ids_and_parsed(tokenizer):
    client = _client(tokenizer, script=Script(replies=[{"content": "On it.", "tool_calls": [CALL]}]))
    reply = _ask(client, tools=TOOLS).json()
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "On it."
    call = choice["message"]["tool_calls"][0]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "bash" and json.loads(call["function"]["arguments"]) == CALL["arguments"]
    expected = 'On it.\n<tool_call>\n{"name": "bash", "arguments": {"command": "echo hello > /workspace/hello.txt"}}\n</tool_call>'
    assert tokenizer.decode(choice["token_ids"][:-1]) == expected == Reply(content="On it.", tool_calls=[CALL]).text()
    assert "# Tools" in tokenizer.decode(reply["prompt_token_ids"])


def test_tool_choice_none_neither_shows_nor_parses_tools(tokenizer):
    client = _client(tokenizer, script=Script(replies=[{"tool_calls": [CALL]}]))
    reply = _ask(client, tools=TOOLS, tool_choice="none").json()
    assert "# Tools" not in tokenizer.decode(reply["prompt_token_ids"])
    assert reply["choices"][0]["message"]["tool_calls"] is None
    assert reply["choices"][0]["message"]["content"].startswith("<tool_call>")


def test_same_script_same_ids(tokenizer):
    runs = [_ask(_client(tokenizer, script=Script(replies=["a b c", {"tool_calls": [CALL]}])), tools=TOOLS).json()
            for _ in range(2)]
    assert runs[0]["choices"][0]["token_ids"] == runs[1]["choices"][0]["token_ids"]
    assert runs[0]["prompt_token_ids"] == runs[1]["prompt_token_ids"]


def test_sessions_by_marker_and_order(tokenizer):
    script = Script(sessions={"TASK-A": ["a1", "a2"], "TASK-B": ["b1"]}, replies=["other"])
    client = _client(tokenizer, script=script)
    got = [_ask(client, content=c).json()["choices"][0]["message"]["content"]
           for c in ("do TASK-A", "do TASK-B", "do TASK-A", "nothing")]
    assert got == ["a1", "b1", "a2", "other"]
    error = _ask(client, content="TASK-B again").json()["error"]
    assert _ask(client, content="TASK-B").status_code == 500
    assert "session 'TASK-B' has 1 replies" in error["message"] and error["code"] == "ModelError"


def test_turn_cursor_makes_retries_idempotent(tokenizer):
    client = _client(tokenizer, script=Script(replies=["first", "second"], cursor="turn", when_done="repeat_last"))
    one = [{"role": "user", "content": "x"}]
    two = one + [{"role": "assistant", "content": "first"}, {"role": "user", "content": "y"}]
    three = two + [{"role": "assistant", "content": "second"}, {"role": "user", "content": "z"}]
    said = [client.post("/v1/chat/completions", json={"messages": m}).json()["choices"][0]["message"]["content"]
            for m in (one, one, two, three)]
    assert said == ["first", "first", "second", "second"]


def test_max_tokens_truncates_with_length(tokenizer):
    client = _client(tokenizer, script=Script(replies=["one two three four five six"]))
    choice = _ask(client, max_tokens=3).json()["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 3
    assert choice["message"]["content"] == tokenizer.decode(choice["token_ids"])


def test_policy_sees_the_request(tokenizer):
    async def policy(request):
        last = request.messages[-1].content
        return Reply(tool_calls=[{"name": "bash", "arguments": {"command": f"echo {last}"}}]) if request.tools else last.upper()

    client = _client(tokenizer, policy=policy)
    assert _ask(client, content="shout").json()["choices"][0]["message"]["content"] == "SHOUT"
    call = _ask(client, content="hi", tools=TOOLS).json()["choices"][0]["message"]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"command": "echo hi"}


def test_bad_policy_reply_is_a_clean_500(tokenizer):
    client = _client(tokenizer, policy=lambda request: {"contents": "typo"})
    response = _ask(client)
    assert response.status_code == 500 and "not a reply" in response.json()["error"]["message"]
    assert _ask(client, tools=TOOLS).json()["error"]["code"] == "ModelError"


def test_a_policy_that_raises_is_a_500_in_openai_shape(tokenizer):
    def policy(request):
        raise KeyError("no such task")

    with TestClient(create_app(ScriptedEngine(tokenizer, policy=policy)), raise_server_exceptions=False) as client:
        response = _ask(client)
    assert response.status_code == 500
    assert response.json()["error"] == {"message": "KeyError: 'no such task'", "type": "server_error",
                                        "param": None, "code": None}


@pytest.mark.parametrize("body, where", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "role"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": -1}, "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "n"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "function"),
    ({"model": "m"}, "messages"),
])
def test_bad_input_is_400_in_openai_shape(tokenizer, body, where):
    response = _client(tokenizer, script=Script(replies=["x"])).post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and where in error["message"]


def test_invalid_json_and_unknown_route(tokenizer):
    client = _client(tokenizer, script=Script(replies=["x"]))
    response = client.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400 and "error" in response.json()
    assert client.get("/v1/nothing").json()["error"]["type"] == "invalid_request_error"


def test_prompt_over_the_context_is_400(tokenizer):
    client = _client(tokenizer, script=Script(replies=["x"]), max_context=50)
    response = _ask(client, content="word " * 100)
    assert response.status_code == 400 and "context is 50" in response.json()["error"]["message"]


def test_models_health_and_stream(tokenizer):
    client = _client(tokenizer, script=Script(replies=[{"content": "ok", "tool_calls": [CALL]}]), model_name="smol")
    assert client.get("/health").json()["status"] == "ok"
    assert client.get("/v1/models").json()["data"][0]["id"] == "smol"
    with client.stream("POST", "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "x"}], "tools": TOOLS, "stream": True}) as response:
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert chunks[1]["choices"][0]["delta"]["content"] == "ok"
    assert chunks[2]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == "bash"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_script_files_and_policy_specs(tmp_path):
    (tmp_path / "s.yaml").write_text("replies:\n  - hi\n  - {tool_calls: [{name: bash, arguments: {command: ls}}]}\n")
    script = load_script(tmp_path / "s.yaml")
    assert script.replies[0].content == "hi" and script.replies[1].tool_calls[0].name == "bash"
    (tmp_path / "s.json").write_text('["a", "b"]')
    assert [r.content for r in load_script(tmp_path / "s.json").replies] == ["a", "b"]
    (tmp_path / "bad.json").write_text('{"replies": [{"text": "x"}]}')
    with pytest.raises(RequestError, match="invalid script"):
        load_script(tmp_path / "bad.json")
    (tmp_path / "pol.py").write_text("def act(request):\n    return 'ok'\n")
    assert load_policy(f"{tmp_path / 'pol.py'}:act")(None) == "ok"
    assert load_policy("json:dumps") is json.dumps
    for spec in ("nocolon", "json:nothing", "no_such_module_xyz:f"):
        with pytest.raises(RequestError):
            load_policy(spec)


def test_engine_needs_exactly_one_source(tokenizer):
    with pytest.raises(ValueError):
        ScriptedEngine(tokenizer)
