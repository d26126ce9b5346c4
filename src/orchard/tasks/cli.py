"""`orchard tasks ...`: list, validate and build task suites and their images."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    tasks = subparsers.add_parser("tasks", help="task suites: list, validate, build").add_subparsers(
        dest="command", required=True)
    _list_parser(tasks.add_parser("list", help="show the tasks of a suite or task file"))
    _validate_parser(tasks.add_parser("validate", help="check tasks in real sandboxes (unsolved as set up, "
                                                       "solved by the reference)"))
    _build_swe_parser(tasks.add_parser("build-swe", help="build the SWE suite by mutating real PyPI packages"))
    images = tasks.add_parser("build-images", help="build (or rebuild) the SWE task images")
    _client_args(images)
    images.add_argument("--image", action="append", help="one image (repeatable; default: all known)")
    images.set_defaults(func=_build_images)
    terminal = tasks.add_parser("build-terminal", help="write the terminal suite's task file from its sources")
    terminal.add_argument("--out", help="default: the shipped data/terminal.jsonl")
    terminal.set_defaults(func=_build_terminal)


def _client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=os.environ.get("SANDBOX_BASE_URL"), help="Orchard Env (default SANDBOX_BASE_URL)")
    p.add_argument("--api-key", default=os.environ.get("SANDBOX_API_KEY"))


def _list_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("suite", help="'swe-mut', 'terminal', or a .jsonl/.jsonl.gz/.parquet file or datasets folder")
    p.add_argument("--split", help="train / test")
    p.add_argument("--json", action="store_true", help="one JSON object per task")
    p.set_defaults(func=_list)


def _validate_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("suite", help="suite name or task file")
    p.add_argument("--split")
    p.add_argument("--limit", type=int, help="only the first N tasks")
    p.add_argument("--ids", help="comma-separated task ids")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--record", help="write the tasks, with the evidence in metadata.validation, to this file")
    _client_args(p)
    p.set_defaults(func=_validate)


def _build_swe_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", help="task file (default: the shipped data/swe.jsonl.gz)")
    p.add_argument("--packages", help="comma-separated package names (default: every image recipe)")
    p.add_argument("--per-package", type=int, default=45)
    p.add_argument("--screen-limit", type=int, default=160, help="candidates tried per package at most")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    _client_args(p)
    p.set_defaults(func=_build_swe)


def _client(args: argparse.Namespace):
    from orchard import SandboxClient

    return SandboxClient(base_url=args.url, api_key=args.api_key)


def _list(args: argparse.Namespace) -> int:
    from orchard.tasks.loaders import load_suite

    tasks = load_suite(args.suite, args.split)
    for t in tasks:
        if args.json:
            print(t.model_dump_json(exclude_none=True))
        else:
            print(f"{t.id}\t{t.split}\t{t.image}\t{t.scoring.kind}\t{t.instruction.strip().splitlines()[0][:70]}")
    if not args.json:
        splits = Counter(t.split for t in tasks)
        print(f"{len(tasks)} tasks ({', '.join(f'{k}: {v}' for k, v in sorted(splits.items()))})", file=sys.stderr)
    return 0


def _validate(args: argparse.Namespace) -> int:
    from orchard.tasks.loaders import load_suite, save_tasks
    from orchard.tasks.validate import validate_all

    tasks = load_suite(args.suite, args.split)
    if args.ids:
        wanted = set(args.ids.split(","))
        tasks = [t for t in tasks if t.id in wanted]
    tasks = tasks[: args.limit] if args.limit else tasks
    with _client(args) as client:
        results = validate_all(client, tasks, args.concurrency,
                               progress=lambda r: print(("ok  " if r.ok else "BAD ") + f"{r.task_id} {r.seconds}s {r.reason}",
                                                        flush=True))
    if args.record:
        by_id = {r.task_id: r for r in results}
        for t in tasks:
            t.metadata["validation"] = by_id[t.id].model_dump(exclude={"task_id", "ok", "reason"})
        save_tasks([t for t in tasks if by_id[t.id].ok], args.record)
    good = sum(r.ok for r in results)
    print(f"{good}/{len(results)} valid in {sum(r.seconds for r in results):.1f} sandbox-seconds")
    return 0 if good == len(results) else 1


def _build_swe(args: argparse.Namespace) -> int:
    from orchard.tasks.swe.build import BuildConfig, build

    cfg = BuildConfig(packages=args.packages.split(",") if args.packages else [], per_package=args.per_package,
                      screen_limit=args.screen_limit, concurrency=args.concurrency, seed=args.seed)
    if args.out:
        cfg.out = Path(args.out)
    with _client(args) as client:
        manifest = build(client, cfg)
    print(json.dumps(manifest, indent=1))
    return 0


def _build_images(args: argparse.Namespace) -> int:
    from orchard.tasks.images import build_image, recipes

    with _client(args) as client:
        for image in args.image or list(recipes()):
            print(build_image(client, image), flush=True)
    return 0


def _build_terminal(args: argparse.Namespace) -> int:
    from orchard.tasks.loaders import SUITES, save_tasks
    from orchard.tasks.terminal import terminal_tasks

    path = save_tasks(terminal_tasks(), args.out or SUITES["terminal"])
    print(f"{len(terminal_tasks())} tasks -> {path}")
    return 0
