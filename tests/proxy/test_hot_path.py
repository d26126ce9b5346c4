"""The proxy's cheap hot path: orjson with exact fallbacks, the lean HTTP/1.1 upstream client, the model-call shortcut."""

from __future__ import annotations

import asyncio
import gzip
import json
import math

import pytest

from orchard.proxy import dialects, fastjson
from orchard.proxy.app import _call_target
from orchard.proxy.http1 import Pool
from orchard.proxy.recorder import encode_line


def test_strict_json_goes_through_orjson_and_the_rest_through_the_standard_library():
    assert fastjson.parse(b'{"a": [1, 2.5, "x"]}') == ({"a": [1, 2.5, "x"]}, True)
    value, strict = fastjson.parse(b'{"t": NaN, "big": 123456789012345678901234567890}')
    assert not strict and math.isnan(value["t"]) and value["big"] == 123456789012345678901234567890
    with pytest.raises(ValueError, match="Expecting"):  # the standard library's message reaches the harness
        fastjson.loads(b"{bad")


def test_dumps_keeps_what_python_would_write():
    assert json.loads(fastjson.dumps({"a": "é", "b": [1, 2.5]})) == {"a": "é", "b": [1, 2.5]}
    assert fastjson.dumps({"a": "é"}) == '{"a":"é"}'.encode()
    assert fastjson.dumps({1: 2}) == b'{"1":2}'  # orjson refuses non-string keys: the standard library takes over
    assert fastjson.dumps({"t": float("nan")}, strict=False) == b'{"t":NaN}'


def test_finite_checks_a_whole_list():
    assert fastjson.finite([]) and fastjson.finite([-0.5, -1.0]) and fastjson.finite(None)
    assert not fastjson.finite([-0.5, float("-inf")]) and not fastjson.finite([float("nan")])


def test_a_call_record_with_an_infinite_logprob_keeps_it():
    line = encode_line({"index": 0, "logprobs": [-0.5, float("-inf")]}, {"reply": b'{"x":1}'}, name_is_calls=True)
    record = json.loads(line)
    assert record["logprobs"] == [-0.5, float("-inf")] and record["reply"] == {"x": 1} and line.endswith(b"}\n")
    fast = encode_line({"index": 0, "logprobs": [-0.5]}, {"reply": b'{"x":1}'}, name_is_calls=True)
    assert json.loads(fast) == {"index": 0, "logprobs": [-0.5], "reply": {"x": 1}}


def test_model_call_paths_take_the_shortcut_and_nothing_else_does():
    assert _call_target("/v1/chat/completions") == (dialects.openai_chat, None)
    assert _call_target("/sessions/s_1/v1/messages") == (dialects.anthropic_messages, "s_1")
    assert _call_target("/sessions/s_1/responses") == (dialects.openai_responses, "s_1")
    for path in ("/v1/chat/completions/", "/sessions//v1/messages", "/sessions/s_1", "/sessions/s_1/reward",
                 "/v1/messages/count_tokens", "/sessions/a/b/v1/messages", "/v1/models"):
        assert _call_target(path) is None, path


class _Server:
    """A raw HTTP server answering each request with the next scripted reply (bytes, or None: close at once)."""

    def __init__(self, replies: list[bytes | None]):
        self.replies, self.connections, self.requests = list(replies), 0, []

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.replies:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next((line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0))
                self.requests.append(head + await reader.readexactly(length))
                reply = self.replies.pop(0)
                if reply is None:
                    break
                writer.write(reply)
                await writer.drain()
                if b"connection: close" in reply.lower():
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


def _ok(body: bytes, extra: str = "") -> bytes:
    return f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\n{extra}\r\n".encode() + body


def _run(replies: list[bytes | None], calls: int, timeout_s: float = 10.0) -> tuple[list, _Server]:
    async def main() -> tuple[list, _Server]:
        server = _Server(replies)
        async with server as url:
            pool = Pool(url, {"authorization": "Bearer k"}, timeout_s)
            out = []
            for _ in range(calls):
                try:
                    reply = await pool.request("POST", "/chat/completions", b'{"q":1}')
                    out.append((reply.status, reply.body))
                except (OSError, TimeoutError) as e:
                    out.append(e)
            pool.close()
        return out, server
    return asyncio.run(main())


def test_keep_alive_reuses_one_connection_and_sends_the_head_and_body():
    out, server = _run([_ok(b"one"), _ok(b"two")], 2)
    assert out == [(200, b"one"), (200, b"two")] and server.connections == 1
    head = server.requests[0].decode()
    assert head.startswith("POST /v1/chat/completions HTTP/1.1\r\n") and "authorization: Bearer k" in head
    assert head.endswith('content-length: 7\r\n\r\n{"q":1}')


def test_chunked_gzip_and_read_to_close_replies():
    chunked = b"HTTP/1.1 500 Oops\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    zipped = gzip.compress(b'{"a":1}')
    out, _ = _run([chunked, _ok(zipped, "content-encoding: gzip\r\n"), b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil eof"], 3)
    assert out == [(500, b"abcde"), (200, b'{"a":1}'), (200, b"until eof")]


def test_a_connection_the_server_dropped_is_replaced():
    out, server = _run([_ok(b"one"), None, _ok(b"two")], 2)  # the server closes the kept-alive connection unanswered
    assert out == [(200, b"one"), (200, b"two")] and server.connections == 2


def test_no_reply_and_a_timeout_are_errors():
    out, _ = _run([b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort"], 1)
    assert isinstance(out[0], ConnectionError)
    out, _ = _run([b"not http at all\r\n\r\n"], 1)
    assert isinstance(out[0], ConnectionError)
    out, _ = _run([b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n", b"never sent"], 1, timeout_s=0.3)
    assert isinstance(out[0], TimeoutError)


def test_unreachable_and_bad_urls():
    with pytest.raises(ValueError):
        Pool("ftp://x", {}, 1.0)

    async def main() -> None:
        with pytest.raises(OSError):
            await Pool("http://127.0.0.1:9/v1", {}, 5.0).request("GET", "/models")
    asyncio.run(main())


def test_lenient_block_writes_like_the_standard_library():
    with fastjson.lenient():
        assert fastjson.dumps({"t": float("nan")}) == b'{"t":NaN}'
    assert fastjson.dumps({"t": float("nan")}) == b'{"t":null}'


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_that_is_not_strict_json_is_forwarded_and_echoed_as_before(proxy, stream):
    session = proxy.open()
    body = b'{"model": "m", "input": "hi", "temperature": NaN, "stream": %s}' % (b"true" if stream else b"false")
    reply = proxy.client.post(session["base_urls"]["openai_responses"] + "/responses", content=body,
                              headers={"Authorization": f"Bearer {session['key']}", "content-type": "application/json"})
    assert reply.status_code == 200 and '"temperature":NaN' in reply.text
    assert math.isnan(proxy.upstream.requests[-1]["temperature"])
    strict = proxy.client.post(session["base_urls"]["openai_responses"] + "/responses", json={"model": "m", "input": "hi", "temperature": 0.5},
                               headers={"Authorization": f"Bearer {session['key']}"})
    assert strict.status_code == 200 and strict.json()["temperature"] == 0.5


def test_prompt_ids_are_checked_and_counted_without_decoding():
    from orchard.proxy.upstream import RawIds, _is_ids, decode_reply

    reply = decode_reply(b'{"id": "x", "choices": [{"index": 0}], "usage": null, "prompt_token_ids": [1, 2,\n3]}')
    assert reply["choices"] == [{"index": 0}] and reply["usage"] is None
    assert isinstance(reply["prompt_token_ids"], RawIds) and len(reply["prompt_token_ids"]) == 3
    assert len(decode_reply(b'{"prompt_token_ids": [ ]}')["prompt_token_ids"]) == 0
    # other shapes take the general path, whose checks and errors are the ones a harness saw before
    for text, ids in ((b'{"prompt_token_ids": [1.5, 2]}', False), (b'{"prompt_token_ids": [[1]]}', False),
                      (b'{"prompt_token_ids": null}', False), (b'{"t": NaN, "prompt_token_ids": [7]}', True)):
        value = decode_reply(text)["prompt_token_ids"]
        assert not isinstance(value, RawIds) and _is_ids(value) is ids
    assert "prompt_token_ids" not in decode_reply(b'{"choices": [{"prompt_token_ids": [4]}]}')
    for bad in (b'[1]', b'{"prompt_token_ids": [1,,2]}'):
        with pytest.raises(Exception, match="not JSON|not a JSON object"):
            decode_reply(bad)
