"""`orchard rollout ...` and `orchard demo`: the engine's commands."""

from __future__ import annotations

import argparse
import sys


def _reported(run) -> int:
    """Run a command; an Orchard error (bad task file, service that will not start, ...) is one line, not a trace."""
    from orchard.errors import OrchardError

    try:
        return run()
    except OrchardError as exc:
        print(f"orchard: {type(exc).__name__}: {exc.detail}", file=sys.stderr)
        return 2


def _rollout(args: argparse.Namespace) -> int:
    from orchard.rollout.run import main
    return _reported(lambda: main(args))


def _bench(args: argparse.Namespace) -> int:
    from orchard.rollout.bench import main
    return _reported(lambda: main(args))


def _demo(args: argparse.Namespace) -> int:
    from orchard.rollout.demo import main
    return _reported(lambda: main(args))


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tasks", default="echo", help="suite name (swe-mut, terminal), task file/folder, or echo[:N]")
    parser.add_argument("--split", help="only this split (train / test)")
    parser.add_argument("--limit", type=int, help="only the first N tasks")
    parser.add_argument("--harness", default="minimal", help="harness adapter (minimal, codex, claude-code, ...)")
    parser.add_argument("--model", default="oracle", help="model endpoint URL, 'oracle' (scripted teacher) or 'local'")
    parser.add_argument("--samples", type=int, default=1, help="rollouts per task (K)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--out", help="run directory (journal, Parquet dataset); required")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out, skipping finished rollouts")
    parser.add_argument("--retry-infra", action="store_true", help="with --resume: run infrastructure failures again")
    parser.add_argument("--max-attempts", type=int, default=3, help="tries per rollout before an infra failure is recorded")
    parser.add_argument("--env-url", help="a running Orchard Env (default: start one); it must allow forwarding to the proxy")
    parser.add_argument("--proxy-url", help="a running `orchard proxy serve --no-auth` (default: start one); "
                                            "--model then only labels the rows")
    parser.add_argument("--oracle-error-rate", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0, help="the oracle's seed")
    parser.add_argument("--max-steps", type=int, default=30, help="agent steps per rollout")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per harness run")
    parser.add_argument("--no-progress", action="store_true", help="no live progress bar")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("rollout", help="run tasks x samples through a harness and a model; write a dataset")
    add_run_arguments(parser)
    parser.set_defaults(func=_rollout)
    sub = parser.add_subparsers(dest="rollout_command")
    bench = sub.add_parser("bench", help="rollouts/min at concurrency 32 with the scripted model; engine overhead")
    bench.add_argument("--rollouts", type=int, default=64)
    bench.add_argument("--concurrency", type=int, default=32)
    bench.add_argument("--out", help="run directory (default: a temporary one)")
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(func=_bench)
    demo = subparsers.add_parser("demo", help="the whole loop: service, proxy, teacher, harness, SWE tasks, eval, viewer")
    demo.add_argument("--model", default="oracle", help="'oracle' (default), 'local' (SmolLM2 on this CPU) or a URL")
    demo.add_argument("--suite", default="swe-mut", help="task suite to pick from")
    demo.add_argument("--tasks", type=int, default=4, help="how many tasks")
    demo.add_argument("--samples", type=int, default=2, help="rollouts per task")
    demo.add_argument("--concurrency", type=int, default=4)
    demo.add_argument("--max-steps", type=int, default=12, help="agent steps per rollout")
    demo.add_argument("--oracle-error-rate", type=float, default=0.3)
    demo.add_argument("--out", default="demo-run", help="where the run, its dataset and the report go")
    demo.add_argument("--port", type=int, default=8765, help="the viewer's port")
    demo.add_argument("--no-view", action="store_true", help="print the viewer's command instead of serving it")
    demo.set_defaults(func=_demo)
