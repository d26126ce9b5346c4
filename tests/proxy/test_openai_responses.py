"""The Responses API (Codex) through the proxy, read by the official `openai` SDK: items, event streams, errors."""

from __future__ import annotations

import json

import openai
import pytest

TOOLS = [{"type": "function", "name": "shell", "description": "run", "parameters": {"type": "object", "properties": {"command": {"type": "array"}}}},
         {"type": "web_search"}]


def sdk(proxy, session) -> openai.OpenAI:
    return openai.OpenAI(base_url=session["base_urls"]["openai_responses"], api_key=session["key"], http_client=proxy.client,
                         max_retries=0)


def test_text_reply(proxy):
    reply = sdk(proxy, proxy.open()).responses.create(model="gpt-x", input="hi", instructions="be kind")
    assert reply.output_text == "ok" and reply.status == "completed" and reply.usage.output_tokens > 0
    assert proxy.upstream.requests[-1]["messages"] == [{"role": "system", "content": "be kind"}, {"role": "user", "content": "hi"}]


def test_function_call_stream_events(proxy, upstream):
    upstream.policy = lambda m, t: {"content": "Running.", "tool_calls": [{"name": "shell", "arguments": {"command": ["ls"]}}]}
    stream = sdk(proxy, proxy.open()).responses.create(model="gpt-x", input="list", tools=TOOLS, stream=True)
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    for kind in ("response.output_item.added", "response.output_text.delta", "response.function_call_arguments.delta",
                 "response.function_call_arguments.done", "response.output_item.done"):
        assert kind in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert done[0].type == "message" and done[0].content[0].text == "Running."
    assert done[1].type == "function_call" and json.loads(done[1].arguments) == {"command": ["ls"]}
    final = events[-1].response
    assert final.output[1].call_id == done[1].call_id and final.usage.total_tokens > 0
    assert upstream.requests[-1]["tools"] == [{"type": "function", "function": {
        "name": "shell", "description": "run", "parameters": TOOLS[0]["parameters"]}}]  # web_search dropped


def test_stream_helper_final_response(proxy, upstream):
    with sdk(proxy, proxy.open()).responses.stream(model="gpt-x", input="hi") as stream:
        final = stream.get_final_response()
    assert final.output_text == "ok"


def test_input_items_translate_to_chat_messages(proxy, upstream):
    items = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
             {"role": "user", "content": "fix it"},
             {"type": "reasoning", "id": "rs_1", "summary": []},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
             {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": '{"command":["ls"]}'},
             {"type": "function_call", "call_id": "c2", "name": "shell", "arguments": '{"command":["pwd"]}'},
             {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
             {"type": "function_call_output", "call_id": "c2", "output": "/w"}]
    sdk(proxy, proxy.open()).responses.create(model="gpt-x", input=items, tools=TOOLS[:1], max_output_tokens=99)
    sent = upstream.requests[-1]
    assert sent["messages"][:2] == [{"role": "system", "content": "rules"}, {"role": "user", "content": "fix it"}]
    assistant = sent["messages"][2]
    assert assistant["content"] == "Looking." and [c["id"] for c in assistant["tool_calls"]] == ["c1", "c2"]
    assert sent["messages"][3:] == [{"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
                                    {"role": "tool", "tool_call_id": "c2", "content": "/w"}]
    assert sent["max_tokens"] == 99


def test_length_cutoff_is_incomplete(proxy, upstream):
    upstream.policy = lambda m, t: {"content": "partial", "finish_reason": "length"}
    reply = sdk(proxy, proxy.open()).responses.create(model="gpt-x", input="hi")
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"


@pytest.mark.parametrize("body, words", [
    ({"model": "m", "input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "not supported"),
    ({"model": "m", "input": [{"type": "item_reference", "id": "x"}]}, "not supported"),
    ({"model": "m", "input": 5}, "'input'"),
])
def test_malformed_requests_get_openai_errors(proxy, body, words):
    session = proxy.open()
    response = proxy.client.post("/v1/responses", json=body, headers={"Authorization": f"Bearer {session['key']}"})
    assert response.status_code == 400
    assert words in response.json()["error"]["message"] and response.json()["error"]["type"] == "invalid_request_error"
