"""`orchard env report`: run load, faults and the attack suite, and write one Markdown report."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from orchard.env.faults import run_faults
from orchard.env.stress import run_mode

ATTACK_TESTS = "tests/env/attack"


class _AttackLog:
    """pytest plugin: one row per attack test: its docstring (what was tried, how it must fail) and outcome."""

    def __init__(self) -> None:
        self.rows: list[dict[str, str]] = []
        self._docs: dict[str, str] = {}

    def pytest_collection_modifyitems(self, items: list[Any]) -> None:
        for item in items:
            doc = (getattr(item, "obj", None).__doc__ or "").strip() if getattr(item, "obj", None) else ""
            self._docs[item.nodeid] = " ".join(doc.split()) or item.name

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            outcome = "xfail" if hasattr(report, "wasxfail") else report.outcome
            self.rows.append({"test": report.nodeid.split("::")[-1], "attack": self._docs.get(report.nodeid, ""),
                              "outcome": outcome})


def run_attacks() -> list[dict[str, str]]:
    """The isolation and attack suite, in-process."""
    import pytest

    log = _AttackLog()
    pytest.main(["-q", "-p", "no:cacheprovider", ATTACK_TESTS], plugins=[log])
    return log.rows


def _stress_args(args: argparse.Namespace) -> SimpleNamespace:
    return SimpleNamespace(url=None, api_key=None, image="host", sandboxes=args.sandboxes, execs_per_sandbox=4,
                           soak_sandboxes=16, duration=args.duration, max_gap=8.0, steps=[8, 32, 128, 256, 512],
                           step_seconds=4.0, ramp_queue=192, fault_commands=200)


def main(args: argparse.Namespace) -> int:
    started = time.time()
    sargs = _stress_args(args)
    results = {mode: run_mode(mode, sargs) for mode in ("burst", "soak", "ramp")}
    results["faults"] = run_faults(sargs)
    results["attacks"] = run_attacks()
    text = render(results, time.time() - started)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(text)
    print(text)
    return 0 if _clean(results) else 1


def _clean(results: dict) -> bool:
    return (not results["burst"]["failures"] and not results["soak"]["failures"] and not results["faults"]["failures"]
            and all(row["outcome"] in ("passed", "xfail") for row in results["attacks"]))


def render(results: dict, elapsed: float) -> str:
    """The Markdown report."""
    burst, soak, ramp, faults = results["burst"], results["soak"], results["ramp"], results["faults"]
    leaks = burst.get("leaks", []) + soak.get("leaks", []) + ramp.get("leaks", []) + \
        [leak for check in faults["checks"] for leak in check.get("leaks", [])]
    lost_results = sum(c.get("results_lost", 0) for c in faults["checks"])
    lines = [
        "# Orchard Env under load, faults and attack",
        "",
        f"Run on {datetime.date.today().isoformat()}, {os.cpu_count()} cores, {platform.system()} "
        f"{platform.release()}, local backend (bubblewrap), image `host`; took {elapsed / 60:.1f} min.",
        "Rerun: `make report` (or `.venv/bin/orchard env report --output docs/env-report.md`).",
        "",
        "## Summary",
        "",
        "| what | result |",
        "| --- | --- |",
        f"| burst: sandboxes × commands, failures | {burst['sandboxes_completed']} × "
        f"{burst['commands'] // max(burst['sandboxes_completed'], 1)}, {burst['failures']} failures in {burst['wall_s']} s |",
        f"| /health during the burst, p50 / p99 | {burst['health_ms']['p50']} / {burst['health_ms']['p99']} ms |",
        f"| service peak memory during the burst | {burst.get('service_peak_rss_mib')} MiB |",
        f"| soak: commands over {soak['duration_s']:.0f} s with idle gaps up to {soak['max_idle_gap_s']} s | "
        f"{soak['commands']}, {soak['failures']} failures |",
        f"| ramp: first 503 + Retry-After at concurrency | {ramp['first_503_at_concurrency']} "
        f"(exec queue bound {ramp.get('exec_queue_limit')}), {ramp['errors']} errors |",
        f"| faults survived | {sum(c['ok'] for c in faults['checks'])} / {len(faults['checks'])} |",
        f"| attacks that failed as they must | {sum(r['outcome'] == 'passed' for r in results['attacks'])} / "
        f"{len(results['attacks'])} |",
        f"| sandboxes and results lost | {lost_results} |",
        f"| leaks found by `orchard env doctor` | {len(leaks)} |",
        "",
        "## Ramp (exec `true`, wait=true)",
        "",
        "| concurrency | ok/s | p50 ms | p99 ms | 503s | errors |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += [f"| {r['concurrency']} | {r['per_s']} | {r['latency_ms']['p50']} | {r['latency_ms']['p99']} | "
              f"{r['rejected_503']} | {r['errors']} |" for r in ramp["steps"]]
    lines += ["", "## Faults", "", "| check | survived | figures |", "| --- | --- | --- |"]
    for check in faults["checks"]:
        figures = ", ".join(f"{k}={v}" for k, v in check.items() if k not in ("check", "ok", "leaks"))
        lines.append(f"| {check['check']} | {'yes' if check['ok'] else 'NO'} | {figures} |")
    lines += ["", "## Attacks", "", "| attack (what was tried, and how it must fail) | result |", "| --- | --- |"]
    lines += [f"| {row['attack'].replace('|', '/')} | {_verdict(row['outcome'])} |" for row in results["attacks"]]
    lines += ["", "## Leaks", ""] + ([f"- {leak}" for leak in leaks] or ["None."]) + [""]
    return "\n".join(lines)


def _verdict(outcome: str) -> str:
    return {"passed": "blocked", "xfail": "known gap (xfail)", "skipped": "skipped"}.get(outcome, f"NOT BLOCKED ({outcome})")
