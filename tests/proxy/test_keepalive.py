"""A slow upstream under a streaming call: the stream opens early with keep-alive comments the SDKs skip, and a
failure after that arrives as the dialect's in-stream error."""

from __future__ import annotations

import anthropic
import openai
import pytest

SLOW = 0.6


@pytest.fixture
def slow_proxy(make_proxy, upstream):
    upstream.policy = lambda m, t: {"content": "late but fine", "delay": SLOW}
    return make_proxy(stream_keepalive_s=0.1)


def test_keepalive_comments_then_the_reply(slow_proxy):
    session = slow_proxy.open()
    raw = slow_proxy.client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {session['key']}"},
                                 json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]})
    assert raw.status_code == 200 and raw.text.startswith(": keepalive\n\n") and raw.text.endswith("data: [DONE]\n\n")
    sdk = openai.OpenAI(base_url=session["base_urls"]["openai_chat"], api_key=session["key"], http_client=slow_proxy.client)
    chunks = list(sdk.chat.completions.create(model="m", stream=True, messages=[{"role": "user", "content": "x"}]))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "late but fine"
    client = anthropic.Anthropic(base_url=session["base_urls"]["anthropic_messages"], api_key=session["key"],
                                 http_client=slow_proxy.client)
    with client.messages.stream(model="m", max_tokens=50, messages=[{"role": "user", "content": "x"}]) as stream:
        assert stream.get_final_message().content[0].text == "late but fine"


def test_late_failures_arrive_in_stream(slow_proxy, upstream):
    upstream.policy = lambda m, t: {"status": 503, "delay": SLOW}
    session = slow_proxy.open()
    client = anthropic.Anthropic(base_url=session["base_urls"]["anthropic_messages"], api_key=session["key"],
                                 http_client=slow_proxy.client, max_retries=0)
    with pytest.raises(anthropic.APIStatusError, match="HTTP 503"):
        with client.messages.stream(model="m", max_tokens=50, messages=[{"role": "user", "content": "x"}]) as stream:
            stream.get_final_message()
    sdk = openai.OpenAI(base_url=session["base_urls"]["openai_chat"], api_key=session["key"], http_client=slow_proxy.client,
                        max_retries=0)
    with pytest.raises(openai.APIError, match="HTTP 503"):
        list(sdk.chat.completions.create(model="m", stream=True, messages=[{"role": "user", "content": "x"}]))
    events = list(sdk.responses.create(model="m", stream=True, input="x"))
    assert events[-1].type == "response.failed" and "HTTP 503" in events[-1].response.error.message
    calls = slow_proxy.admin("GET", f"/sessions/{session['id']}/calls").json()
    assert [c["infra_failure"] for c in calls] == [True, True, True]
