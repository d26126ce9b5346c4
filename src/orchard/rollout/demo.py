"""`orchard demo` (what `make demo` runs): the whole loop on embedded defaults, from sandboxes to an eval report.

Orchard Env (local backend), the recording proxy, the oracle teacher (or SmolLM2 with --model local),
the built-in harness, a handful of SWE tasks from the shipped mutation suite, the evaluation report,
and the trajectory viewer's address.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any


def pick_tasks(suite: str, n: int) -> list[Any]:
    """n tasks of the suite's test split, taken round-robin across packages so the demo shows several."""
    from orchard.rollout.tasks import load

    tasks = load(suite, "test") or load(suite)
    by_group: dict[str, list[Any]] = {}
    for t in tasks:
        by_group.setdefault(t.group, []).append(t.task)
    picked: list[Any] = []
    while len(picked) < n and any(by_group.values()):
        for group in sorted(by_group):
            if by_group[group] and len(picked) < n:
                picked.append(by_group[group].pop(0))
    return picked


def _step(title: str) -> float:
    print(f"\n== {title}", flush=True)
    return time.monotonic()


def main(args: argparse.Namespace) -> int:
    from orchard.eval.report import build_report, load_run
    from orchard.eval.write import markdown, write_all
    from orchard.rollout.engine import EngineConfig
    from orchard.rollout.run import RolloutConfig, print_stats, run_rollouts
    from orchard.tasks.loaders import save_tasks

    t0 = _step(f"tasks: {args.tasks} from the {args.suite} suite")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tasks = pick_tasks(args.suite, args.tasks)
    task_file = save_tasks(tasks, out / "demo-tasks.jsonl")
    for t in tasks:
        print(f"  {t.id}: {t.instruction.strip().splitlines()[0][:100]}")

    _step(f"rollouts: {args.samples} per task, harness minimal, model {args.model} (through the proxy), fresh sandboxes")
    engine = EngineConfig(out=out / "run", samples=args.samples, concurrency=args.concurrency, resume=True,
                          progress=sys.stdout.isatty())
    run = run_rollouts(RolloutConfig(tasks=str(task_file), harness="minimal", model=args.model, engine=engine,
                                     oracle_error_rate=args.oracle_error_rate, max_steps=args.max_steps))
    print_stats(run)

    _step("evaluation")
    report = build_report(load_run(out / "run"), name="demo")
    paths = write_all(out / "eval", report)
    print(markdown(report).split("\n## Per task")[0])
    print("report: " + ", ".join(str(p) for p in paths))
    print(f"\ndataset: {out / 'run' / 'trajectories.parquet'} and samples.parquet "
          f"(datasets.load_dataset('parquet', data_files=...))")
    print(f"whole loop: {time.monotonic() - t0:.0f}s")
    return _view(out / "run", args)


def _view(run_dir: Path, args: argparse.Namespace) -> int:
    """Serve the viewer until Ctrl-C on a terminal; elsewhere print how to start it."""
    command = f"orchard view {run_dir} --port {args.port}"
    if args.no_view or not sys.stdin.isatty():
        print(f"\nviewer: run `{command}` and open http://127.0.0.1:{args.port}/")
        return 0
    import uvicorn

    from orchard.view.app import create_app
    from orchard.view.cli import _decoder

    print(f"\nviewer: http://127.0.0.1:{args.port}/  (Ctrl-C to stop; later: `{command}`)", flush=True)
    uvicorn.run(create_app(run_dir, _decoder(True)), host="127.0.0.1", port=args.port, log_level="warning")
    return 0
