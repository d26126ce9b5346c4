"""`orchard harness install|list|run`: the harness adapters' commands (heavy imports stay inside each command)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _install(args: argparse.Namespace) -> int:
    from pathlib import Path

    from orchard.errors import HarnessError
    from orchard.harnesses import HARNESSES, get_harness
    from orchard.harnesses.tools import default_tools_dir

    tools_dir = Path(args.tools_dir).resolve() if args.tools_dir else default_tools_dir()
    try:
        for harness in [get_harness(n) for n in args.names] or list(HARNESSES.values()):
            started = time.monotonic()
            state = "already installed" if harness.installed(tools_dir) else "installed"
            harness.install(tools_dir)
            print(f"{harness.name}: {state} ({time.monotonic() - started:.1f}s)", flush=True)
    except HarnessError as e:
        print(f"error: {e.detail}", file=sys.stderr)
        return 2
    print(f"tools folder: {tools_dir} (start the service with ORCHARD_TOOLS_DIR={tools_dir})")
    return 0


def _list(args: argparse.Namespace) -> int:
    from pathlib import Path

    from orchard.harnesses import HARNESSES
    from orchard.harnesses.tools import default_tools_dir

    tools_dir = Path(args.tools_dir).resolve() if args.tools_dir else default_tools_dir()
    for harness in HARNESSES.values():
        print(f"{harness.name:16} {harness.dialect:20} {'installed' if harness.installed(tools_dir) else 'not installed'}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from orchard import SandboxClient
    from orchard.errors import OrchardError
    from orchard.harnesses import Budget, Endpoint, run_harness

    try:
        endpoint = Endpoint.from_session(_session(args.session), port=args.port, model=args.model)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: --session must be the proxy's POST /sessions reply (JSON text or a file) with key and base_urls: {e}",
              file=sys.stderr)
        return 2
    try:
        with SandboxClient(base_url=args.url, api_key=args.api_key) as client:
            result = run_harness(client, args.sandbox, args.harness, endpoint, args.instruction,
                                 Budget(max_steps=args.max_steps, timeout_s=args.timeout), workdir=args.workdir)
    except OrchardError as e:
        print(f"error: {type(e).__name__}: {e.detail}", file=sys.stderr)
        return 2
    print(result.model_dump_json(indent=2))
    return 0 if result.reason == "done" else 1


def _session(text: str) -> dict:
    if text.lstrip().startswith("{"):
        return json.loads(text)
    with open(text) as f:
        return json.load(f)


def register(subparsers: argparse._SubParsersAction) -> None:
    harness = subparsers.add_parser("harness", help="agent harnesses: install into the tools folder, run in a sandbox")
    sub = harness.add_subparsers(dest="command", required=True)
    tools_help = "the tools folder (default: ORCHARD_TOOLS_DIR or ~/.cache/orchard/tools)"

    install = sub.add_parser("install", help="install harnesses (default: all) into the tools folder; idempotent")
    install.add_argument("names", nargs="*", help="codex, claude-code, opencode, mini-swe-agent, minimal")
    install.add_argument("--tools-dir", help=tools_help)
    install.set_defaults(func=_install)

    listing = sub.add_parser("list", help="the harnesses, their model API and whether they are installed")
    listing.add_argument("--tools-dir", help=tools_help)
    listing.set_defaults(func=_list)

    run = sub.add_parser("run", help="run a harness once in an existing sandbox against a proxy session")
    run.add_argument("--harness", required=True)
    run.add_argument("--instruction", required=True)
    run.add_argument("--sandbox", required=True, help="sandbox id (made with model_endpoint={port: P, target: proxy})")
    run.add_argument("--session", required=True, help="the proxy's POST /sessions reply: JSON text or a file")
    run.add_argument("--port", type=int, required=True, help="the sandbox's model-endpoint port P")
    run.add_argument("--model", default="orchard", help="model name the harness asks for")
    run.add_argument("--workdir", default="/workspace")
    run.add_argument("--max-steps", type=int, default=30)
    run.add_argument("--timeout", type=float, default=900.0, help="wall-clock seconds")
    run.add_argument("--url", default=os.environ.get("SANDBOX_BASE_URL", "http://127.0.0.1:8080"))
    run.add_argument("--api-key", default=os.environ.get("SANDBOX_API_KEY"))
    run.set_defaults(func=_run)
