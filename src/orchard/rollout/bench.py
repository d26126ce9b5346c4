"""`orchard rollout bench`: rollouts/min at a given concurrency with the scripted model, and the engine's own overhead."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from statistics import mean, quantiles
from typing import Any


def figures(rows: list[dict[str, Any]], stats: dict[str, Any]) -> dict[str, Any]:
    """Throughput, where a rollout's time goes, and the engine's share of it."""
    ok = [r for r in rows if not r["failure_kind"]]
    fractions = sorted(r["overhead_s"] / r["total_s"] for r in ok if r["total_s"])
    cuts = quantiles(fractions, n=20) if len(fractions) >= 2 else fractions * 19
    return {
        "rollouts": len(rows), "scored": len(ok), "infra_failures": stats["infra_failures"],
        "wall_s": round(stats["wall_s"], 2), "rollouts_per_min": round(stats["rollouts_per_min"], 1),
        "mean_rollout_s": round(mean(r["total_s"] for r in ok), 3) if ok else None,
        "mean_s": {k: round(mean(r[k] or 0.0 for r in ok), 3) for k in
                   ("sandbox_s", "harness_s", "model_s", "grade_s", "proxy_s", "overhead_s")} if ok else {},
        "overhead_fraction_total": stats["overhead_fraction"], "proxy_fraction_total": stats["proxy_fraction"],
        "loop_lag_fraction": stats["loop_lag_fraction"],
        "overhead_fraction_p50": cuts[9] if cuts else None, "overhead_fraction_p95": cuts[18] if cuts else None,
    }


def main(args: argparse.Namespace) -> int:
    from orchard.rollout.engine import EngineConfig
    from orchard.rollout.run import RolloutConfig, run_rollouts

    out = Path(args.out or tempfile.mkdtemp(prefix="orchard-rollout-bench-"))
    tasks = max(1, min(args.rollouts, 64))
    samples = -(-args.rollouts // tasks)
    engine = EngineConfig(out=out, samples=samples, concurrency=args.concurrency, progress=not args.json)
    run = run_rollouts(RolloutConfig(tasks=f"echo:{tasks}", model="oracle", oracle_error_rate=0.0, engine=engine,
                                     max_steps=10, timeout_s=300))
    result = {"concurrency": args.concurrency, **figures(run.rows, run.stats), "out": str(out)}
    if args.json:
        print(json.dumps(result))
        return 0
    m = result["mean_s"]
    print(f"{result['rollouts']} rollouts (echo tasks, built-in harness, scripted oracle through the proxy) "
          f"at concurrency {args.concurrency}: {result['rollouts_per_min']} rollouts/min, wall {result['wall_s']}s")
    print(f"mean rollout {result['mean_rollout_s']}s = sandbox {m.get('sandbox_s')}s + harness {m.get('harness_s')}s "
          f"(model {m.get('model_s')}s inside) + grade {m.get('grade_s')}s + proxy bookkeeping {m.get('proxy_s')}s "
          f"+ engine {m.get('overhead_s')}s")
    frac, proxy = result["overhead_fraction_total"], result["proxy_fraction_total"]
    print(f"engine overhead: {100 * frac:.2f}% of rollout wall time (per rollout p50 "
          f"{100 * result['overhead_fraction_p50']:.2f}%, p95 {100 * result['overhead_fraction_p95']:.2f}%); "
          f"with proxy bookkeeping {100 * (frac + proxy):.2f}%; infrastructure failures {json.dumps(result['infra_failures'])}")
    print(f"engine event loop late (blocked or starved of CPU) {100 * result['loop_lag_fraction']:.2f}% of the run's wall time")
    return 0
