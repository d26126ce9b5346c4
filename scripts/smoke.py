#!/usr/bin/env python3
"""Smoke test of a deployed Orchard Env through the SDK alone: create, exec, files, block_network, delete.

    SANDBOX_API_KEY=... python scripts/smoke.py --url https://orchard.example.com [--image python:3.11-slim]

Each check prints PASS or FAIL with what it saw; the exit code is 0 when every check passed, 1 otherwise.
--probe HOST:PORT is what a sandbox without network must NOT reach (default: the cluster's API server, which
every pod reaches unless a NetworkPolicy forbids it); --reachable HOST:PORT, when given, is what a sandbox
created with block_network=false MUST reach (a positive control for the egress policy); --model-endpoint
HOST:PORT, when given, is an allow-listed model_endpoint target answering HTTP (the model proxy) that a closed
sandbox MUST reach on its 127.0.0.1:8000 (the model-endpoint relay and its egress policy).
Needs only the `orchard` package's SDK (httpx and pydantic): `pip install orchard` on any machine.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import shlex
import sys
import time
from typing import Callable, Optional

import httpx

from orchard import OrchardError, SandboxClient

# Bash opens the TCP connection itself (no curl or python needed in the image); `timeout` bounds a silent drop.
CONNECT = "timeout {seconds} bash -c 'exec 3<>/dev/tcp/{host}/{port}' 2>&1"
# ...and asks for / over HTTP/1.0, printing the start of the reply (an HTTP server answers with a status line)
HTTP_GET = ("timeout {seconds} bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port} && printf \"GET / HTTP/1.0\\r\\n\\r\\n\" >&3 "
            "&& head -c 12 <&3' 2>&1")
MODEL_PORT = 8000


class Smoke:
    """Runs named checks in order, prints each outcome, remembers failures."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def check(self, name: str, step: Callable[[], str]) -> bool:
        started = time.monotonic()
        try:
            detail = step()
        except (OrchardError, httpx.HTTPError, AssertionError, OSError, TimeoutError) as e:
            self.failures.append(name)
            print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
            return False
        print(f"PASS {name} ({(time.monotonic() - started) * 1000:.0f} ms){': ' + detail if detail else ''}", flush=True)
        return True


def host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def _target(text: str) -> str:
    host_port(text)
    return text


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=os.environ.get("SANDBOX_BASE_URL"), help="the service (default $SANDBOX_BASE_URL)")
    parser.add_argument("--api-key", default=os.environ.get("SANDBOX_API_KEY"), help="default $SANDBOX_API_KEY")
    parser.add_argument("--image", default="host", help="sandbox image; it needs bash and timeout (default: host)")
    parser.add_argument("--probe", type=host_port, default=("kubernetes.default.svc", 443),
                        help="HOST:PORT a blocked sandbox must not reach (default kubernetes.default.svc:443)")
    parser.add_argument("--reachable", type=host_port, help="HOST:PORT a networked sandbox must reach (optional)")
    parser.add_argument("--model-endpoint", type=_target, metavar="HOST:PORT",
                        help=f"allow-listed model_endpoint target answering HTTP that a closed sandbox must reach "
                             f"on its 127.0.0.1:{MODEL_PORT} (optional)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds to wait for a sandbox to be ready")
    args = parser.parse_args(argv)
    if not args.url:
        parser.error("give --url or set SANDBOX_BASE_URL")
    return args


def run(args: argparse.Namespace) -> list[str]:
    """Every check against one service; the names of those that failed."""
    smoke = Smoke()
    with SandboxClient(base_url=args.url, api_key=args.api_key, timeout=args.timeout + 60) as client:
        if not smoke.check("health", lambda: client.health().status):
            return smoke.failures
        holder: dict = {}
        if smoke.check("create", lambda: _create(client, args, holder, block_network=True)):
            try:
                _sandbox_checks(smoke, holder["sandbox"], args)
            finally:
                smoke.check("delete", lambda: _delete(client, holder["sandbox"]))
        if args.reachable:
            smoke.check("egress of a networked sandbox", lambda: _networked(client, args))
        if args.model_endpoint:
            smoke.check("model_endpoint of a closed sandbox", lambda: _model_endpoint(client, args))
    return smoke.failures


def _create(client: SandboxClient, args: argparse.Namespace, holder: dict, block_network: bool) -> str:
    sandbox = client.create_sandbox(args.image, block_network=block_network, timeout=args.timeout)
    holder["sandbox"] = sandbox
    return f"{sandbox.sandbox_id} ({args.image})"


def _sandbox_checks(smoke: Smoke, sandbox, args: argparse.Namespace) -> None:
    smoke.check("exec", lambda: _exec(sandbox))
    smoke.check("exec exit code", lambda: _exit_code(sandbox))
    smoke.check("files round trip", lambda: _files(sandbox))
    smoke.check("block_network", lambda: _blocked(sandbox, *args.probe))


def _exec(sandbox) -> str:
    result = sandbox.exec("echo orchard-smoke; echo to-stderr >&2")
    assert result.exit_code == 0, f"exit code {result.exit_code}, stderr {result.stderr!r}"
    assert result.stdout == "orchard-smoke\n", f"stdout {result.stdout!r}"
    assert result.stderr == "to-stderr\n", f"stderr {result.stderr!r}"
    return "stdout and stderr as written"


def _exit_code(sandbox) -> str:
    result = sandbox.exec(["bash", "-c", "exit 7"])
    assert result.exit_code == 7, f"exit code {result.exit_code}"
    return "7 as asked"


def _files(sandbox) -> str:
    payload = secrets.token_bytes(256 * 1024) + bytes(range(256))
    folder = f"/tmp/orchard-smoke-{secrets.token_hex(4)}"
    sandbox.exec(["mkdir", "-p", folder])
    sandbox.upload_content(payload, f"{folder}/blob.bin")
    back = sandbox.download_content(f"{folder}/blob.bin")
    assert back == payload, f"downloaded {len(back)} bytes that differ from the {len(payload)} uploaded"
    names = {entry.name: entry for entry in sandbox.list_files(folder)}
    assert "blob.bin" in names and names["blob.bin"].size == len(payload), f"listing: {sorted(names)}"
    seen = sandbox.exec(["sha256sum", f"{folder}/blob.bin"])
    assert seen.stdout.split()[0] == hashlib.sha256(payload).hexdigest(), f"in-sandbox checksum {seen.stdout!r}"
    return f"{len(payload)} bytes up, down, listed and checksummed inside"


def _connect(sandbox, host: str, port: int, seconds: int = 5):
    return sandbox.exec(CONNECT.format(seconds=seconds, host=shlex.quote(host), port=port), timeout=seconds + 30)


def _blocked(sandbox, host: str, port: int) -> str:
    result = _connect(sandbox, host, port)
    assert result.exit_code != 0, f"a sandbox without network reached {host}:{port}"
    said = (result.stdout or result.stderr).strip().splitlines()
    return f"{host}:{port} unreachable ({said[-1][:100] if said else 'timed out'})"


def _networked(client: SandboxClient, args: argparse.Namespace) -> str:
    host, port = args.reachable
    holder: dict = {}
    _create(client, args, holder, block_network=False)
    try:
        result = _connect(holder["sandbox"], host, port)
        assert result.exit_code == 0, f"a networked sandbox could not reach {host}:{port}: {result.stdout.strip()}"
    finally:
        _delete(client, holder["sandbox"])
    return f"{host}:{port} reached"


def _model_endpoint(client: SandboxClient, args: argparse.Namespace, seconds: int = 10) -> str:
    sandbox = client.create_sandbox(args.image, timeout=args.timeout,
                                    model_endpoint={"port": MODEL_PORT, "target": args.model_endpoint})
    try:
        result = sandbox.exec(HTTP_GET.format(seconds=seconds, port=MODEL_PORT), timeout=seconds + 30)
        assert result.stdout.startswith("HTTP/"), \
            f"127.0.0.1:{MODEL_PORT} did not relay to {args.model_endpoint}: {result.stdout.strip()[-200:]!r}"
    finally:
        _delete(client, sandbox)
    return f"127.0.0.1:{MODEL_PORT} -> {args.model_endpoint} answered {result.stdout.splitlines()[0]!r}"


def _delete(client: SandboxClient, sandbox, within: float = 60) -> str:
    client.delete_sandbox(sandbox.sandbox_id)
    deadline = time.monotonic() + within
    while any(s.sandbox_id == sandbox.sandbox_id for s in client.list_sandboxes()):
        assert time.monotonic() < deadline, f"still listed {within:.0f} s after its deletion"
        time.sleep(1)
    return f"{sandbox.sandbox_id} gone"


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    print(f"Orchard Env smoke test of {args.url} (image {args.image})", flush=True)
    failures = run(args)
    print(f"{'FAILED: ' + ', '.join(failures) if failures else 'all checks passed'}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
