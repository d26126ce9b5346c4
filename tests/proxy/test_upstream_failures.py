"""Upstream trouble: no token ids (refused unless text-only), 5xx, timeouts, unreachable: clean errors, recorded failures."""

from __future__ import annotations

import json

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def call(proxy, session, path="/v1/chat/completions", body=CHAT):
    return proxy.client.post(path, json=body, headers={"Authorization": f"Bearer {session['key']}"})


def calls_of(proxy, session):
    return proxy.admin("GET", f"/sessions/{session['id']}/calls").json()


def test_upstream_without_token_ids_is_refused_at_the_first_call(proxy, upstream):
    upstream.token_ids = False
    session = proxy.open()
    first = call(proxy, session)
    assert first.status_code == 400 and "no token ids" in first.json()["error"]["message"]
    second = call(proxy, session, "/v1/messages", {"model": "m", "max_tokens": 5, "messages": CHAT["messages"]})
    assert second.status_code == 400 and "refused" in second.json()["error"]["message"]
    assert len(upstream.requests) == 1
    [record] = calls_of(proxy, session)
    assert record["status"] == "error" and record["infra_failure"] is True and "UpstreamNoTokensError" in record["error"]
    assert proxy.admin("GET", f"/sessions/{session['id']}").json()["status"] == "refused"


def test_text_only_session_records_text(proxy, upstream):
    upstream.token_ids = False
    session = proxy.open(text_only=True)
    assert call(proxy, session).json()["choices"][0]["message"]["content"] == "ok"
    [record] = calls_of(proxy, session)
    assert record["status"] == "ok" and record["text_only"] and record["completion_token_ids"] == []
    assert record["reply"]["choices"][0]["message"]["content"] == "ok"


def test_upstream_5xx_is_a_clean_error_and_an_infra_failure(proxy, upstream):
    upstream.policy = lambda m, t: {"status": 503}
    session = proxy.open()
    response = call(proxy, session, "/v1/messages", {"model": "m", "max_tokens": 5, "messages": CHAT["messages"]})
    assert response.status_code == 502 and response.json()["error"]["type"] == "api_error"
    [record] = calls_of(proxy, session)
    assert record["infra_failure"] is True and record["status"] == "error" and "HTTP 503" in record["error"]
    upstream.policy = lambda m, t: {"content": "back"}
    assert call(proxy, session).status_code == 200  # the session goes on: the harness may retry


def test_upstream_4xx_is_the_requests_fault_not_infra(proxy, upstream):
    upstream.policy = lambda m, t: {"status": 400}
    session = proxy.open()
    response = call(proxy, session, "/v1/responses", {"model": "m", "input": "x"})
    assert response.status_code == 400 and "refused the request" in response.json()["error"]["message"]
    assert calls_of(proxy, session)[0]["infra_failure"] is False


def test_upstream_timeout(make_proxy, upstream):
    proxy = make_proxy(upstream_timeout_s=0.2)
    upstream.policy = lambda m, t: {"content": "late", "delay": 1.0}
    session = proxy.open()
    response = call(proxy, session)
    assert response.status_code == 504 and response.json()["error"]["code"] == "upstream_error"
    assert calls_of(proxy, session)[0]["infra_failure"] is True


def test_unreachable_upstream(make_proxy):
    proxy = make_proxy(upstream_url="http://127.0.0.1:9")
    session = proxy.open()
    response = call(proxy, session)
    assert response.status_code == 502 and "cannot be reached" in response.json()["error"]["message"]
    assert calls_of(proxy, session)[0]["infra_failure"] is True


def test_misaligned_logprobs_are_an_upstream_error(proxy, upstream):
    original = upstream.completion

    def broken(request, decision):
        reply = original(request, decision)
        reply["choices"][0]["logprobs"]["content"].pop()
        return reply

    upstream.completion = broken
    try:
        session = proxy.open()
        assert call(proxy, session).status_code == 502
        assert "not aligned" in json.dumps(calls_of(proxy, session))
    finally:
        del upstream.completion


def test_text_only_session_still_keeps_tokens_an_upstream_returns(proxy, upstream):
    session = proxy.open(text_only=True)
    call(proxy, session)
    [record] = calls_of(proxy, session)
    assert not record["text_only"] and record["completion_token_ids"] and record["prompt_token_ids"]
