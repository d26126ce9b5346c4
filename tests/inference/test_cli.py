"""`orchard model serve --script` end to end: a real uvicorn process answering over HTTP."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read()
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.2)
    raise AssertionError(f"{url} never answered")


def test_scripted_server_over_http(tmp_path, tokenizer):
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"content": "Done.", "tool_calls": [{"name": "finish", "arguments": {}}]}]))
    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "orchard.cli", "model", "serve", "--script", str(script),
                                "--port", str(port), "--served-name", "smol-script"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait(f"{base}/health", process)
        assert httpx.get(f"{base}/v1/models").json()["data"][0]["id"] == "smol-script"
        reply = httpx.post(f"{base}/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "go"}], "logprobs": True, "return_token_ids": True,
            "tools": [{"type": "function", "function": {"name": "finish", "parameters": {"type": "object"}}}]}).json()
        choice = reply["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["tool_calls"][0]["function"]["name"] == "finish"
        assert tokenizer.decode(choice["token_ids"]) == ('Done.\n<tool_call>\n{"name": "finish", "arguments": {}}\n'
                                                         "</tool_call><|im_end|>")
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_scripted_serve_needs_one_source():
    result = subprocess.run([sys.executable, "-m", "orchard.cli", "model", "serve", "--scripted"],
                            capture_output=True, text=True)
    assert result.returncode != 0 and "exactly one of --script FILE or --policy" in result.stderr


def test_bench_prints_tokens_per_second():
    result = subprocess.run([sys.executable, "-m", "orchard.cli", "model", "bench", "--batch", "1", "2",
                             "--max-tokens", "2", "--repeats", "1", "--threads", "1", "--json"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert [r["batch"] for r in report["results"]] == [1, 2]
    assert all(r["tokens"] == 2 * r["batch"] and r["tokens_per_s"] > 0 and r["peak_batch"] == r["batch"]
               for r in report["results"])
    assert all(r["baseline_generate_tokens_per_s"] > 0 and r["vs_baseline"] > 0 for r in report["results"])
