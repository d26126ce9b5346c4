"""The `orchard` command: `orchard env ...` here, every other area registered from its own `cli` module."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Optional


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from orchard.env.server import create_app
    from orchard.env.settings import Settings

    overrides = {k: v for k, v in {
        "host": args.host, "port": args.port, "backend": args.backend, "state_dir": args.state_dir,
        "store": args.store, "redis_url": args.redis_url, "replica_id": args.replica_id,
        "api_keys": args.api_key or None, "admin_keys": args.admin_key or None,
        "no_auth": True if args.no_auth else None}.items() if v is not None}
    settings = Settings(**overrides)
    _raise_fd_limit()
    app = create_app(settings)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=args.log_level,
                loop="uvloop", http="httptools", ws="websockets-sansio", access_log=False, timeout_graceful_shutdown=10,
                timeout_keep_alive=75, server_header=False)
    return 0


def _raise_fd_limit() -> None:
    """Thousands of sandboxes need thousands of descriptors: take the hard limit (no privilege needed)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _bench(args: argparse.Namespace) -> int:
    from orchard.env.bench import main as bench_main
    return bench_main(args)


def _stress(args: argparse.Namespace) -> int:
    from orchard.env.stress import main as stress_main
    return stress_main(args)


def _doctor(args: argparse.Namespace) -> int:
    from orchard.env.doctor import main as doctor_main
    return doctor_main(args)


def _report(args: argparse.Namespace) -> int:
    from orchard.env.report import main as report_main
    return report_main(args)


def _demo(args: argparse.Namespace) -> int:
    from orchard.env.demo import main as demo_main
    return demo_main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orchard", description="Orchard: environments for training and evaluating LLM agents.")
    top = parser.add_subparsers(dest="area", required=True)
    env = top.add_parser("env", help="Orchard Env, the sandbox service").add_subparsers(dest="command", required=True)

    serve = env.add_parser("serve", help="run the service (every flag also reads ORCHARD_<NAME>)")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--backend", choices=["local", "container", "kubernetes"])
    serve.add_argument("--state-dir")
    serve.add_argument("--store", choices=["sqlite", "redis"], help="sqlite (default, one replica) or redis (several)")
    serve.add_argument("--redis-url", help="redis://host:port/db of the shared store (with --store redis)")
    serve.add_argument("--replica-id", help="this replica's name among replicas (default hostname-pid)")
    serve.add_argument("--api-key", action="append", help="accepted key (repeatable)")
    serve.add_argument("--admin-key", action="append", help="key that sees every sandbox (repeatable)")
    serve.add_argument("--no-auth", action="store_true", help="accept requests without a key")
    serve.add_argument("--log-level", default=os.environ.get("ORCHARD_LOG_LEVEL", "info"))
    serve.set_defaults(func=_serve)

    bench = env.add_parser("bench", help="measure create/exec/delete latency and throughput")
    bench.add_argument("--url", help="a running service (default: start one on a free port)")
    bench.add_argument("--api-key", default=os.environ.get("SANDBOX_API_KEY"))
    bench.add_argument("--sandboxes", type=int, default=100)
    bench.add_argument("--execs-per-sandbox", type=int, default=4)
    bench.add_argument("--concurrency", type=int, default=64)
    bench.add_argument("--image", default="host")
    bench.add_argument("--backend", choices=["local", "container"], default="local",
                       help="container: exec latency of the container backend's fast and API paths vs podman exec")
    bench.add_argument("--docker-host", help="with --backend container: an engine socket (default: start a Podman API service)")
    bench.add_argument("--latency-samples", type=int, default=200, help="sequential `true` execs for round-trip latency")
    bench.add_argument("--no-baseline", action="store_true", help="skip the podman exec baseline")
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.set_defaults(func=_bench)

    from orchard.env.stress import add_arguments as stress_arguments
    stress = env.add_parser("stress", help="burst, soak, ramp and fault runs with figures")
    stress_arguments(stress)
    stress.set_defaults(func=_stress)

    doctor = env.add_parser("doctor", help="list what the backend left behind that no record owns")
    doctor.add_argument("--state-dir", help="the service's state dir (default: ORCHARD_STATE_DIR)")
    doctor.add_argument("--backend", choices=["local", "container", "kubernetes"], help="default: ORCHARD_BACKEND")
    doctor.add_argument("--store", choices=["sqlite", "redis"], help="where the records are (default: ORCHARD_STORE)")
    doctor.add_argument("--redis-url", help="the Redis store (default: ORCHARD_REDIS_URL)")
    doctor.add_argument("--min-age", type=float, help="seconds an unowned sandbox is left alone as maybe being "
                        "created (container, kubernetes; default: ORCHARD_RECONCILE_MIN_AGE)")
    doctor.add_argument("--fix", action="store_true", help="remove what was found")
    doctor.set_defaults(func=_doctor)

    report = env.add_parser("report", help="run stress, faults and attacks; write a Markdown report")
    report.add_argument("--output", default="docs/env-report.md")
    report.add_argument("--sandboxes", type=int, default=1000)
    report.add_argument("--duration", type=float, default=60.0, help="soak length")
    report.set_defaults(func=_report)

    demo = env.add_parser("demo", help="start the service, run commands in a sandbox, clean up")
    demo.add_argument("--image", default="host")
    demo.set_defaults(func=_demo)
    importlib.import_module("orchard.env.settings_doc").register(env)
    for module in AREAS:
        importlib.import_module(module).register(top)
    return parser


# Each area adds its own `orchard <area> ...` commands: a module with `register(subparsers)` that imports
# nothing heavy at module level (torch, transformers, FastAPI load inside the command's function).
AREAS: tuple[str, ...] = (
    "orchard.rollout.cli", "orchard.eval.cli", "orchard.view.cli",
    "orchard.inference.cli", "orchard.proxy.cli", "orchard.harnesses.cli",
    "orchard.tasks.cli",
)


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
