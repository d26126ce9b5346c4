"""`run_rollouts(config)`: the Python API under `orchard rollout`, which starts what is missing and runs the engine."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field

from orchard.rollout.engine import Engine, EngineConfig, RolloutRun


class RolloutConfig(BaseModel):
    """Everything one rollout run needs; the fields mirror `orchard rollout`'s flags."""

    model_config = ConfigDict(extra="forbid")

    tasks: str = Field(description="A shipped suite ('swe-mut', 'terminal'), a task file or folder, or 'echo[:N]'.")
    split: Optional[str] = Field(None, description="Only tasks of this split (train / test).")
    limit: Optional[int] = Field(None, gt=0, description="Only the first N tasks.")
    harness: str = Field("minimal", description="Harness adapter name.")
    model: str = Field(description="Model endpoint URL (OpenAI-compatible with token ids), 'oracle' or 'local'.")
    engine: EngineConfig = Field(description="Samples, concurrency, output directory, retries, resume.")
    env_url: Optional[str] = Field(None, description="A running Orchard Env (default: start one, local backend); "
                                                     "its ORCHARD_FORWARD_ALLOWLIST must hold the proxy's host:port.")
    proxy_url: Optional[str] = Field(None, description="A running `orchard proxy serve` (--no-auth, loopback) in front "
                                                       "of the model; then `model` only labels the rows.")
    oracle_error_rate: float = Field(0.3, ge=0, le=1, description="With model 'oracle': share of deliberately flawed runs.")
    oracle_seed: int = Field(0, description="With model 'oracle': seed of its choices.")
    max_steps: int = Field(30, gt=0, description="Agent steps (model calls) per rollout.")
    timeout_s: float = Field(900.0, gt=0, description="Wall-clock limit of one harness run.")


def _oracle_file(tasks: list[Any], out: Path) -> Path:
    from orchard.tasks.loaders import save_tasks

    path = out / "oracle-tasks.jsonl"
    save_tasks([t.task for t in tasks], path)
    return path


def _tools_dir(harness: str) -> Path:
    """The tools folder, with the harness installed in it (once)."""
    from orchard.harnesses.tools import default_tools_dir
    from orchard.rollout.harness import adapter

    tools = default_tools_dir()
    h = adapter(harness)
    if not h.installed(tools):
        h.install(tools)
    return tools


async def _run(config: RolloutConfig, tasks: list[Any], env_url: str, proxy_url: str) -> RolloutRun:
    from orchard.client.aio import AsyncSandboxClient
    from orchard.harnesses.base import Budget
    from orchard.rollout.gateway import ProxyGateway
    from orchard.rollout.harness import AdapterRunner

    gateway = ProxyGateway(proxy_url, upstream=config.model, session_options={"max_calls": config.max_steps + 1})
    runner = AdapterRunner(config.harness, config.engine.sandbox_port,
                           Budget(max_steps=config.max_steps, timeout_s=config.timeout_s))
    try:
        async with AsyncSandboxClient(base_url=env_url, auto_cleanup=False) as client:
            return await Engine(config.engine, tasks, runner, gateway, client).run()
    finally:
        await gateway.aclose()


def run_rollouts(config: RolloutConfig) -> RolloutRun:
    """Run config.tasks x samples through the harness and model; write the dataset to config.engine.out."""
    from orchard.rollout.stack import Stack
    from orchard.rollout.tasks import load

    tasks = load(config.tasks, config.split, config.limit)
    out = config.engine.out
    out.mkdir(parents=True, exist_ok=True)
    oracle = _oracle_file(tasks, out) if config.model == "oracle" else None
    with Stack(config.model, out / "services", oracle, config.oracle_error_rate, config.oracle_seed,
               config.env_url, _tools_dir(config.harness), config.proxy_url) as stack:
        return asyncio.run(_run(config, tasks, stack.env_url, stack.proxy_url))


def config_from_args(args: argparse.Namespace) -> RolloutConfig:
    if not args.out:
        raise SystemExit("orchard rollout: --out DIR is required")
    engine = EngineConfig(out=Path(args.out), samples=args.samples, concurrency=args.concurrency, resume=args.resume,
                          retry_infra=args.retry_infra, max_attempts=args.max_attempts, progress=not args.no_progress)
    return RolloutConfig(tasks=args.tasks, split=args.split, limit=args.limit, harness=args.harness, model=args.model,
                         engine=engine, env_url=args.env_url, proxy_url=args.proxy_url, oracle_error_rate=args.oracle_error_rate,
                         oracle_seed=args.seed, max_steps=args.max_steps, timeout_s=args.timeout)


def print_stats(run: RolloutRun) -> None:
    s = run.stats
    rate = "-" if s["pass_rate"] is None else f"{100 * s['pass_rate']:.1f}%"
    frac = "-" if s["overhead_fraction"] is None else f"{100 * s['overhead_fraction']:.2f}%"
    mean = "-" if s["mean_rollout_s"] is None else f"{s['mean_rollout_s']:.2f}s"
    print(f"{s['done']}/{s['total']} rollouts in {run.out}: pass rate {rate} over {s['scored']} scored; "
          f"infrastructure failures {json.dumps(s['infra_failures'])}")
    proxy = "-" if s["proxy_fraction"] is None else f"{100 * s['proxy_fraction']:.2f}%"
    print(f"this invocation: {s['ran_now']} rollouts in {s['wall_s']:.1f}s = {s['rollouts_per_min']:.1f} rollouts/min; "
          f"mean rollout {mean}; engine overhead {frac} of rollout wall time (proxy bookkeeping {proxy} more)")


def main(args: argparse.Namespace) -> int:
    run = run_rollouts(config_from_args(args))
    print_stats(run)
    return 0
