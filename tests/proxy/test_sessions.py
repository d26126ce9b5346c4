"""Sessions: admin key, session keys (no open relay), path prefixes, limits that end a harness, reward, close."""

from __future__ import annotations

import time

from tests.proxy.conftest import UPSTREAM_KEY

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def call(proxy, key, path="/v1/chat/completions", body=CHAT, header="authorization"):
    value = f"Bearer {key}" if header == "authorization" else key
    return proxy.client.post(path, json=body, headers={header: value})


def test_sessions_need_the_admin_key(proxy):
    assert proxy.client.post("/sessions", json={}).status_code == 401
    response = proxy.client.post("/sessions", json={}, headers={"Authorization": "Bearer nope"})
    assert response.status_code == 403 and response.json()["error"] == "ForbiddenError"
    assert proxy.client.get("/sessions").status_code == 401


def test_no_auth_mode_opens_sessions_without_a_key(make_proxy):
    proxy = make_proxy(no_auth=True, admin_keys=[])
    assert proxy.client.post("/sessions", json={}).status_code == 201


def test_unknown_or_missing_keys_are_refused(proxy, upstream):
    proxy.open()
    assert call(proxy, "sk-guess").status_code == 403
    assert proxy.client.post("/v1/chat/completions", json=CHAT).status_code == 401
    assert call(proxy, "sk-guess", "/v1/messages", header="x-api-key").json()["type"] == "error"
    assert upstream.requests == []


def test_path_prefix_needs_that_sessions_key(proxy):
    first, second = proxy.open(), proxy.open()
    assert call(proxy, first["key"], f"/sessions/{first['id']}/v1/chat/completions").status_code == 200
    assert call(proxy, second["key"], f"/sessions/{first['id']}/v1/chat/completions").status_code == 403


def test_upstream_sees_the_proxys_key_never_the_sessions(proxy, upstream):
    session = proxy.open()
    call(proxy, session["key"])
    assert upstream.headers[-1]["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert session["key"] not in str(upstream.headers[-1])


def test_call_limit_ends_the_harness_and_keeps_its_calls(proxy):
    session = proxy.open(max_calls=2)
    assert [call(proxy, session["key"]).status_code for _ in range(2)] == [200, 200]
    refused = call(proxy, session["key"])
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "session_limit_reached"
    anthropic = call(proxy, session["key"], "/v1/messages", {"model": "m", "max_tokens": 5, **{"messages": CHAT["messages"]}})
    assert anthropic.json()["error"]["type"] == "invalid_request_error" and "limit" in anthropic.json()["error"]["message"]
    view = proxy.admin("GET", f"/sessions/{session['id']}").json()
    assert view["status"] == "limit_reached" and "call limit" in view["reason"] and len(view["calls"]) == 2


def test_token_limit_caps_max_tokens_then_refuses(proxy, upstream):
    session = proxy.open(max_tokens=20)
    assert call(proxy, session["key"]).status_code == 200
    assert upstream.requests[-1]["max_tokens"] == 20  # capped to what is left
    assert call(proxy, session["key"]).status_code == 200  # 12 of 20 tokens sampled so far
    assert upstream.requests[-1]["max_tokens"] == 8
    assert call(proxy, session["key"]).status_code == 400  # 24 sampled (the fake ignores max_tokens): over
    assert proxy.admin("GET", f"/sessions/{session['id']}").json()["reason"].startswith("token limit")


def test_wall_clock_limit(proxy):
    session = proxy.open(max_seconds=0.05)
    time.sleep(0.1)
    response = call(proxy, session["key"], "/v1/responses", {"model": "m", "input": "x"})
    assert response.status_code == 400 and "wall-clock" in response.json()["error"]["message"]


def test_reward_view_and_close(proxy):
    session = proxy.open(metadata={"task": "hello"})
    call(proxy, session["key"])
    assert proxy.admin("POST", f"/sessions/{session['id']}/reward", json={"reward": 1.0, "info": {"tests": "passed"}}).status_code == 200
    view = proxy.admin("GET", f"/sessions/{session['id']}").json()
    assert view["reward"] == 1.0 and view["options"]["metadata"] == {"task": "hello"}
    assert view["calls"][0]["status"] == "ok" and view["calls"][0]["completion_tokens"] > 0
    assert proxy.admin("POST", f"/sessions/{session['id']}/close").json()["status"] == "closed"
    assert call(proxy, session["key"]).status_code == 400
    assert proxy.admin("GET", "/sessions/s_nope").status_code == 404
    assert proxy.admin("POST", f"/sessions/{session['id']}/reward", json={"reward": "high"}).status_code == 422


def test_bad_session_options_are_refused(proxy):
    assert proxy.admin("POST", "/sessions", json={"max_calls": 0}).status_code == 422
    assert proxy.admin("POST", "/sessions", json={"bogus": 1}).status_code == 422


def test_session_model_overrides_the_harness_model(proxy, upstream):
    session = proxy.open(model="served-model")
    reply = call(proxy, session["key"]).json()
    assert upstream.requests[-1]["model"] == "served-model" and reply["model"] == "m"


def test_base_urls_answer_a_reachability_probe(proxy):
    session = proxy.open()
    assert proxy.client.head(f"/sessions/{session['id']}").status_code == 200
    assert proxy.client.head("/").status_code == 200


def test_unknown_endpoints_answer_404_in_the_dialect(proxy):
    response = proxy.client.post("/v1/embeddings", json={})
    assert response.status_code == 404 and response.json()["error"]["type"] == "not_found_error"
    response = proxy.client.get("/v1/files", headers={"anthropic-version": "2023-06-01"})
    assert response.status_code == 404 and response.json()["type"] == "error"
