"""Chat Completions through the proxy, read by the official `openai` SDK: replies, chunk streams, tool calls, errors."""

from __future__ import annotations

import json

import openai
import pytest

from orchard.proxy.fake_upstream import END

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a command",
                                           "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]


def sdk(proxy, session) -> openai.OpenAI:
    return openai.OpenAI(base_url=session["base_urls"]["openai_chat"], api_key=session["key"], http_client=proxy.client,
                         max_retries=0)


def test_plain_reply(proxy):
    session = proxy.open()
    reply = sdk(proxy, session).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "ok"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens == len(("ok" + END).encode())


def test_tool_call_reply_and_stream(proxy, upstream):
    upstream.policy = lambda m, t: {"content": "Let me look.", "tool_calls": [{"name": "bash", "arguments": {"command": "ls -a"}}]}
    client = sdk(proxy, proxy.open())
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "list"}], tools=TOOLS)
    call = reply.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("bash", {"command": "ls -a"})
    assert reply.choices[0].finish_reason == "tool_calls"

    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "list"}], tools=TOOLS,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    arguments = "".join(tc.function.arguments or "" for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or [])
    names = [tc.function.name for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or [] if tc.function.name]
    assert text == "Let me look." and names == ["bash"] and json.loads(arguments) == {"command": "ls -a"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 0


def test_stream_helper_accumulates(proxy, upstream):
    upstream.policy = lambda m, t: {"content": None, "tool_calls": [{"name": "bash", "arguments": {"command": "pwd"}}]}
    client = sdk(proxy, proxy.open())
    with client.chat.completions.stream(model="m", messages=[{"role": "user", "content": "x"}], tools=TOOLS) as stream:
        final = stream.get_final_completion()
    assert json.loads(final.choices[0].message.tool_calls[0].function.arguments) == {"command": "pwd"}


def test_history_with_tool_results_reaches_upstream(proxy, upstream):
    client = sdk(proxy, proxy.open())
    messages = [{"role": "developer", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "list"}]},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command":"ls"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}]
    client.chat.completions.create(model="m", messages=messages, tools=TOOLS, temperature=0.5, seed=3, max_tokens=50)
    sent = upstream.requests[-1]
    assert sent["messages"][0] == {"role": "system", "content": "be brief"}
    assert sent["messages"][1]["content"] == "list"
    assert sent["messages"][2]["tool_calls"][0]["id"] == "c1" and sent["messages"][3]["tool_call_id"] == "c1"
    assert (sent["stream"], sent["logprobs"], sent["return_token_ids"]) == (False, True, True)
    assert (sent["temperature"], sent["seed"], sent["max_tokens"]) == (0.5, 3, 50)


@pytest.mark.parametrize("body, words", [
    ({"model": "m", "messages": []}, "non-empty"),
    ({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "role"),
    ({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "not supported"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}, "integer"),
])
def test_malformed_requests_get_openai_errors(proxy, body, words):
    session = proxy.open()
    response = proxy.client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {session['key']}"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and words in error["message"]


def test_invalid_json_is_a_400_and_sdk_raises(proxy):
    session = proxy.open()
    response = proxy.client.post("/v1/chat/completions", content=b"{nope", headers={"Authorization": f"Bearer {session['key']}"})
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError):
        sdk(proxy, session).chat.completions.create(model="m", messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}])


def test_models_list(proxy):
    models = sdk(proxy, proxy.open()).models.list()
    assert "fake-model" in [m.id for m in models.data]
