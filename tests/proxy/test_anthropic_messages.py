"""Anthropic Messages (Claude Code) through the proxy, read by the official `anthropic` SDK: blocks, streams, errors."""

from __future__ import annotations

import anthropic
import pytest

TOOLS = [{"name": "Bash", "description": "run", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}]


def sdk(proxy, session, header: str = "api_key") -> anthropic.Anthropic:
    credentials = {header: session["key"]}
    return anthropic.Anthropic(base_url=session["base_urls"]["anthropic_messages"], http_client=proxy.client,
                               max_retries=0, **credentials)


def test_text_reply(proxy):
    reply = sdk(proxy, proxy.open()).messages.create(model="claude-x", max_tokens=100, system="be kind",
                                                     messages=[{"role": "user", "content": "hi"}])
    assert reply.content[0].text == "ok" and reply.stop_reason == "end_turn" and reply.usage.output_tokens > 0
    assert proxy.upstream.requests[-1]["messages"][0] == {"role": "system", "content": "be kind"}


def test_tool_use_stream_with_bearer_token(proxy, upstream):
    upstream.policy = lambda m, t: {"content": "Checking.", "tool_calls": [{"name": "Bash", "arguments": {"command": "ls"}}]}
    client = sdk(proxy, proxy.open(), header="auth_token")
    with client.messages.stream(model="claude-x", max_tokens=100, tools=TOOLS,
                                messages=[{"role": "user", "content": "list"}]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and "content_block_delta" in kinds and kinds[-1] == "message_stop"
    assert final.content[0].text == "Checking."
    assert (final.content[1].type, final.content[1].name, final.content[1].input) == ("tool_use", "Bash", {"command": "ls"})
    assert final.stop_reason == "tool_use" and final.usage.output_tokens > 0


def test_raw_stream_event_order(proxy, upstream):
    upstream.policy = lambda m, t: {"content": None, "tool_calls": [{"name": "Bash", "arguments": {"command": "pwd"}}]}
    events = list(sdk(proxy, proxy.open()).messages.create(model="claude-x", max_tokens=100, tools=TOOLS, stream=True,
                                                           messages=[{"role": "user", "content": "x"}]))
    assert [e.type for e in events] == ["message_start", "content_block_start", "content_block_delta", "content_block_stop",
                                        "message_delta", "message_stop"]
    assert events[2].delta.type == "input_json_delta" and events[4].delta.stop_reason == "tool_use"


def test_blocks_translate_to_chat_messages(proxy, upstream):
    messages = [{"role": "user", "content": [{"type": "text", "text": "list files"}]},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                                  {"type": "text", "text": "Sure."},
                                                  {"type": "tool_use", "id": "tu1", "name": "Bash", "input": {"command": "ls"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": [{"type": "text", "text": "a.txt"}]},
                                             {"type": "text", "text": "and now?"}]}]
    sdk(proxy, proxy.open()).messages.create(model="claude-x", max_tokens=64, tools=TOOLS, messages=messages,
                                             system=[{"type": "text", "text": "sys"}], tool_choice={"type": "any"})
    sent = upstream.requests[-1]
    assert sent["messages"][0] == {"role": "system", "content": "sys"}
    assert sent["messages"][2]["content"] == "Sure." and sent["messages"][2]["tool_calls"][0]["function"]["name"] == "Bash"
    assert sent["messages"][3] == {"role": "tool", "tool_call_id": "tu1", "content": "a.txt"}
    assert sent["messages"][4] == {"role": "user", "content": "and now?"}
    assert sent["tool_choice"] == "required" and sent["tools"][0]["function"]["parameters"] == TOOLS[0]["input_schema"]


def test_count_tokens(proxy):
    count = sdk(proxy, proxy.open()).messages.count_tokens(model="claude-x", messages=[{"role": "user", "content": "hello there"}])
    assert count.input_tokens > 0


@pytest.mark.parametrize("body, words", [
    ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]}, "image blocks are not supported"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}, "role"),
])
def test_malformed_requests_get_anthropic_errors(proxy, body, words):
    session = proxy.open()
    response = proxy.client.post(f"/sessions/{session['id']}/v1/messages", json=body, headers={"x-api-key": session["key"]})
    assert response.status_code == 400
    assert response.json()["type"] == "error" and response.json()["error"]["type"] == "invalid_request_error"
    assert words in response.json()["error"]["message"]


def test_sdk_raises_typed_errors(proxy):
    session = proxy.open()
    with pytest.raises(anthropic.BadRequestError):
        sdk(proxy, session).messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
    with pytest.raises(anthropic.PermissionDeniedError):
        sdk(proxy, {**session, "key": "sk-wrong"}).messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}])


def test_models_list_for_anthropic_sdk(proxy):
    assert "fake-model" in [m.id for m in sdk(proxy, proxy.open()).models.list()]


def test_stop_sequence_is_reported(proxy, upstream):
    upstream.policy = lambda m, t: {"content": "one two", "stop_reason": "THREE"}
    client = sdk(proxy, proxy.open())
    reply = client.messages.create(model="m", max_tokens=20, stop_sequences=["THREE"], messages=[{"role": "user", "content": "count"}])
    assert (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", "THREE")
    assert upstream.requests[-1]["stop"] == ["THREE"]
    with client.messages.stream(model="m", max_tokens=20, stop_sequences=["THREE"], messages=[{"role": "user", "content": "x"}]) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "THREE")
