"""`orchard eval RUN_DIR [--compare OTHER] --out DIR`: the evaluation report of a rollout run."""

from __future__ import annotations

import argparse
from pathlib import Path


def _eval(args: argparse.Namespace) -> int:
    from orchard.rollout.cli import _reported
    return _reported(lambda: _eval_run(args))


def _eval_run(args: argparse.Namespace) -> int:
    from orchard.eval.report import build_report, compare_reports, load_run
    from orchard.eval.write import markdown, write_all

    rep = build_report(load_run(args.run_dir), name=Path(args.run_dir).name)
    other = cmp = None
    if args.compare:
        other = build_report(load_run(args.compare), name=Path(args.compare).name)
        cmp = compare_reports(rep, other)
    out = Path(args.out or Path(args.run_dir) / "eval")
    paths = write_all(out, rep, other, cmp)
    print(markdown(rep, cmp).split("\n## Per package")[0])
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("eval", help="resolve rate, pass@k, pass^k of a rollout run (JSON, Markdown, PNG)")
    parser.add_argument("run_dir", help="a directory written by `orchard rollout`")
    parser.add_argument("--compare", metavar="OTHER", help="a second run to compare against (other minus this)")
    parser.add_argument("--out", help="output directory (default RUN_DIR/eval)")
    parser.set_defaults(func=_eval)
