"""The proxy in front of the project's scripted model server (a real tokenizer): every dialect's two-turn tool
conversation stitches into one trajectory whose masked tokens decode to exactly the text the upstream produced."""

from __future__ import annotations

import anthropic
import openai
import pytest

from tests.proxy.conftest import serve_in_thread

scripted = pytest.importorskip("orchard.inference.scripted")
api = pytest.importorskip("orchard.inference.api")
hermes = pytest.importorskip("orchard.inference.hermes")


def policy(request):
    """Call the shell first; once a tool result is in, finish."""
    last = request.messages[-1]
    if last.role == "tool":
        return {"content": "Done."}
    return {"content": "Let me check.", "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]}


@pytest.fixture(scope="module")
def scripted_url():
    from orchard.inference.weights import load_tokenizer

    tokenizer = load_tokenizer()
    server, thread, url = serve_in_thread(api.create_app(scripted.ScriptedEngine(tokenizer, policy=policy)))
    yield url, tokenizer
    server.should_exit = True
    thread.join(timeout=10)


def expected_text() -> str:
    first = hermes.render_turn("Let me check.", [("bash", {"command": "ls"})])
    return first + "<|im_end|>" + "Done." + "<|im_end|>"


def chat(session, client):
    sdk = openai.OpenAI(base_url=session["base_urls"]["openai_chat"], api_key=session["key"], http_client=client, max_retries=0)
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]
    messages = [{"role": "user", "content": "list the files"}]
    first = sdk.chat.completions.create(model="m", messages=messages, tools=tools).choices[0].message
    messages += [first.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "a.txt"}]
    assert sdk.chat.completions.create(model="m", messages=messages, tools=tools, stream=True) is not None


def responses(session, client):
    sdk = openai.OpenAI(base_url=session["base_urls"]["openai_responses"], api_key=session["key"], http_client=client, max_retries=0)
    tools = [{"type": "function", "name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}]
    with sdk.responses.stream(model="m", input="list the files", tools=tools) as stream:
        first = stream.get_final_response()
    items = [{"role": "user", "content": "list the files"}] + [item.model_dump(exclude_none=True) for item in first.output]
    items.append({"type": "function_call_output", "call_id": first.output[1].call_id, "output": "a.txt"})
    sdk.responses.create(model="m", input=items, tools=tools)


def messages(session, client):
    sdk = anthropic.Anthropic(base_url=session["base_urls"]["anthropic_messages"], api_key=session["key"], http_client=client, max_retries=0)
    tools = [{"name": "bash", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}]
    history = [{"role": "user", "content": "list the files"}]
    with sdk.messages.stream(model="m", max_tokens=200, tools=tools, messages=history) as stream:
        first = stream.get_final_message()
    history += [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": first.content[1].id, "content": "a.txt"}]}]
    sdk.messages.create(model="m", max_tokens=200, tools=tools, messages=history)


@pytest.mark.parametrize("conversation", [chat, responses, messages])
def test_trajectory_decodes_to_the_upstreams_text(make_proxy, scripted_url, conversation):
    url, tokenizer = scripted_url
    proxy = make_proxy(upstream_url=url)
    session = proxy.open()
    conversation(session, proxy.client)
    result = proxy.admin("GET", f"/sessions/{session['id']}/trajectories").json()
    [trajectory] = result["trajectories"]
    assert trajectory["calls"] == [0, 1]
    sampled = [t for t, m in zip(trajectory["input_ids"], trajectory["loss_mask"]) if m]
    assert tokenizer.decode(sampled) == expected_text()
    first = result["samples"][0]
    assert tokenizer.decode(first["input_ids"][first["prompt_length"]:]) == expected_text().split("<|im_end|>")[0] + "<|im_end|>"
