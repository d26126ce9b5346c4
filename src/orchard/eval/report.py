"""Turn a rollout run's dataset into an evaluation report (a plain dict) and compare two reports."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from statistics import mean
from typing import Any, Optional

from orchard.errors import RequestError
from orchard.eval.metrics import pass_at_k, pass_hat_k

COLUMNS = ["rollout_id", "task_id", "group", "harness", "model", "resolved", "failure_kind", "reward"]


def load_run(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows (one per rollout) of a run directory's trajectories.parquet, only the columns eval needs."""
    import pyarrow.parquet as pq

    path = Path(run_dir) / "trajectories.parquet"
    if not path.is_file():
        raise RequestError(f"{run_dir} is not a rollout run: {path.name} is missing (run `orchard rollout` first)")
    return pq.read_table(path, columns=COLUMNS).to_pylist()


def _task_counts(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per task: its group, n scored samples, c resolved, and how many were infrastructure failures."""
    tasks: dict[str, dict[str, Any]] = {}
    for row in rows:
        t = tasks.setdefault(row["task_id"], {"group": row["group"], "n": 0, "c": 0, "infra": 0})
        if row["failure_kind"]:
            t["infra"] += 1
        else:
            t["n"] += 1
            t["c"] += int(bool(row["resolved"]))
    return tasks


def _curve(tasks: dict[str, dict[str, Any]], estimator, k_max: int) -> dict[int, float]:
    """Mean over scored tasks of estimator(n, c, k) for k = 1..k_max."""
    scored = [t for t in tasks.values() if t["n"] > 0]
    return {k: mean(estimator(t["n"], t["c"], k) for t in scored) for k in range(1, k_max + 1)} if scored else {}


def _groups(tasks: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per group (package): tasks, samples, resolved samples, resolve rate."""
    acc: dict[str, dict[str, Any]] = defaultdict(lambda: {"tasks": 0, "n": 0, "c": 0})
    for t in tasks.values():
        g = acc[t["group"] or "-"]
        g["tasks"] += 1
        g["n"] += t["n"]
        g["c"] += t["c"]
    return {name: {**g, "resolve_rate": g["c"] / g["n"] if g["n"] else None} for name, g in sorted(acc.items())}


def build_report(rows: list[dict[str, Any]], name: str = "run") -> dict[str, Any]:
    """Resolve rate, pass@k and pass^k (k up to the smallest scored n of any task), per-task and per-group tables."""
    if not rows:
        raise RequestError("the run has no rollouts")
    tasks = _task_counts(rows)
    scored_ns = [t["n"] for t in tasks.values() if t["n"] > 0]
    k_max = min(scored_ns) if scored_ns else 0
    n_scored = sum(scored_ns)
    failures: dict[str, int] = defaultdict(int)
    for row in rows:
        if row["failure_kind"]:
            failures[row["failure_kind"]] += 1
    return {
        "name": name, "harness": sorted({r["harness"] for r in rows}), "model": sorted({r["model"] for r in rows}),
        "rollouts": len(rows), "scored": n_scored, "infra_failures": dict(sorted(failures.items())),
        "tasks": len(tasks), "resolve_rate": sum(t["c"] for t in tasks.values()) / n_scored if n_scored else None,
        "pass_at_k": _curve(tasks, pass_at_k, k_max), "pass_hat_k": _curve(tasks, pass_hat_k, k_max),
        "per_group": _groups(tasks),
        "per_task": {tid: {**t, "rate": t["c"] / t["n"] if t["n"] else None} for tid, t in sorted(tasks.items())},
    }


def compare_reports(base: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Differences other - base: resolve rate, pass@k at shared k, per task; tasks that flipped either way."""
    def delta(a: Optional[float], b: Optional[float]) -> Optional[float]:
        return None if a is None or b is None else b - a

    shared = sorted(set(base["per_task"]) & set(other["per_task"]))
    per_task = {t: delta(base["per_task"][t]["rate"], other["per_task"][t]["rate"]) for t in shared}
    solved = lambda rep, t: (rep["per_task"][t]["c"] or 0) > 0  # noqa: E731
    return {
        "base": base["name"], "other": other["name"], "shared_tasks": len(shared),
        "resolve_rate_delta": delta(base["resolve_rate"], other["resolve_rate"]),
        "pass_at_k_delta": {k: other["pass_at_k"][k] - v for k, v in base["pass_at_k"].items() if k in other["pass_at_k"]},
        "per_task_delta": per_task,
        "newly_solved": [t for t in shared if solved(other, t) and not solved(base, t)],
        "newly_unsolved": [t for t in shared if solved(base, t) and not solved(other, t)],
    }
