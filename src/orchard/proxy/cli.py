"""`orchard proxy serve|export|bench`: the harness proxy's commands (heavy imports stay inside each command)."""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
import sys


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from orchard.proxy.app import ProxySettings, create_app

    if args.no_auth and not _is_loopback(args.host):
        print("--no-auth is allowed only on a loopback address (--host 127.0.0.1): otherwise anyone could open sessions",
              file=sys.stderr)
        return 2
    admin_keys = args.admin_key or []
    if not admin_keys and not args.no_auth:
        admin_keys = ["ork-admin-" + secrets.token_urlsafe(18)]
        print(f"admin key (pass --admin-key or ORCHARD_PROXY_ADMIN_KEY to choose one): {admin_keys[0]}", file=sys.stderr, flush=True)
    settings = ProxySettings(upstream_url=args.upstream, upstream_api_key=args.upstream_key, model=args.model,
                             store_dir=args.store, durability=args.durability, admin_keys=admin_keys, no_auth=args.no_auth,
                             upstream_timeout_s=args.upstream_timeout, public_url=args.public_url)
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level=args.log_level, loop="uvloop",
                http="httptools", access_log=False, timeout_keep_alive=75, server_header=False)
    return 0


def _export(args: argparse.Namespace) -> int:
    from orchard.errors import OrchardError
    from orchard.proxy.export import export

    try:
        counts = export(args.store, args.out)
    except OrchardError as e:
        print(f"error: {e.detail}", file=sys.stderr)
        return 2
    print(" ".join(f"{name}={n}" for name, n in counts.items()), f"-> {args.out}")
    return 0


def _delay_ms(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of milliseconds: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"a delay must be 0 ms or more, not {text}")
    return value


def _history_kb(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"a whole number of KB, 0 or more, not {text!r}")
    return int(text)


def _bench(args: argparse.Namespace) -> int:
    from orchard.proxy.bench import main
    return main(args)


def register(subparsers: argparse._SubParsersAction) -> None:
    proxy = subparsers.add_parser("proxy", help="the recording harness proxy").add_subparsers(dest="command", required=True)
    env = os.environ.get

    serve = proxy.add_parser("serve", help="run the proxy in front of an OpenAI-compatible upstream")
    serve.add_argument("--upstream", default=env("ORCHARD_PROXY_UPSTREAM"), required=env("ORCHARD_PROXY_UPSTREAM") is None,
                       help="the upstream model server, e.g. http://127.0.0.1:8000 (vLLM, SGLang, orchard model serve)")
    serve.add_argument("--host", default=env("ORCHARD_PROXY_HOST", "127.0.0.1"))
    serve.add_argument("--port", type=int, default=int(env("ORCHARD_PROXY_PORT", "8090")))
    serve.add_argument("--store", default=env("ORCHARD_PROXY_STORE", "proxy-store"), help="where calls are recorded")
    serve.add_argument("--durability", choices=["fsync", "flush"], default=env("ORCHARD_PROXY_DURABILITY", "fsync"),
                       help="fsync: on disk before each reply (default); flush: in the kernel (survives a proxy crash)")
    serve.add_argument("--admin-key", action="append", default=[k for k in [env("ORCHARD_PROXY_ADMIN_KEY")] if k],
                       help="key that manages sessions (repeatable; default: a random one, printed)")
    serve.add_argument("--no-auth", action="store_true", help="manage sessions without a key (loopback only)")
    serve.add_argument("--upstream-key", default=env("ORCHARD_PROXY_UPSTREAM_KEY"), help="key sent upstream (stays in the proxy)")
    serve.add_argument("--model", default=env("ORCHARD_PROXY_MODEL"), help="model name sent upstream (default: the harness's)")
    serve.add_argument("--upstream-timeout", type=float, default=600.0, help="seconds to wait for the upstream")
    serve.add_argument("--public-url", default=env("ORCHARD_PROXY_PUBLIC_URL"), help="base of the per-session URLs handed out")
    serve.add_argument("--log-level", default="warning")
    serve.set_defaults(func=_serve)

    export = proxy.add_parser("export", help="write sessions, calls, samples and trajectories of a store as Parquet")
    export.add_argument("--store", required=True)
    export.add_argument("--out", required=True)
    export.set_defaults(func=_export)

    bench = proxy.add_parser("bench", help="latency the proxy adds, throughput at 64 sessions (proxy vs direct), CPU per call")
    bench.add_argument("--latency-calls", type=int, default=400, help="sequential calls per path for p50/p99")
    bench.add_argument("--sessions", type=int, default=64, help="concurrent sessions for throughput")
    bench.add_argument("--calls-per-session", type=int, default=40)
    bench.add_argument("--upstream", help="a running upstream to measure against (default: start the in-package fake)")
    bench.add_argument("--upstream-delay-ms", type=_delay_ms, nargs="+", default=[0.0, 20.0],
                       help="service time the fake upstream adds to each call; one measurement per value (default: 0 20)")
    bench.add_argument("--history-kb", type=_history_kb, default=0,
                       help="earlier conversation in each request, in 1 KB turns (default 0: a one-line question)")
    bench.add_argument("--durability", choices=["fsync", "flush"], default="fsync")
    bench.add_argument("--dialect", choices=["openai_chat", "openai_responses", "anthropic_messages"], default="openai_chat")
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.set_defaults(func=_bench)
