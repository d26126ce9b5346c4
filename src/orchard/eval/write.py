"""Write an evaluation report as JSON, Markdown and PNG plots (pass@k against k, per-package bars)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _summary_md(rep: dict[str, Any]) -> list[str]:
    infra = ", ".join(f"{k} {v}" for k, v in rep["infra_failures"].items()) or "none"
    lines = [f"# Evaluation: {rep['name']}", "",
             f"- harness: {', '.join(rep['harness'])}; model: {', '.join(rep['model'])}",
             f"- rollouts: {rep['rollouts']} ({rep['scored']} scored; infrastructure failures, excluded: {infra})",
             f"- tasks: {rep['tasks']}; **resolve rate: {_pct(rep['resolve_rate'])}**", "",
             "| k | pass@k | pass^k |", "| --- | --- | --- |"]
    lines += [f"| {k} | {_pct(v)} | {_pct(rep['pass_hat_k'][k])} |" for k, v in rep["pass_at_k"].items()]
    return lines


def _tables_md(rep: dict[str, Any]) -> list[str]:
    lines = ["", "## Per package", "", "| package | tasks | samples | resolved | rate |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {g} | {v['tasks']} | {v['n']} | {v['c']} | {_pct(v['resolve_rate'])} |" for g, v in rep["per_group"].items()]
    lines += ["", "## Per task", "", "| task | package | samples | resolved | infra | rate |", "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {t} | {v['group']} | {v['n']} | {v['c']} | {v['infra']} | {_pct(v['rate'])} |" for t, v in rep["per_task"].items()]
    return lines


def _compare_md(cmp: dict[str, Any]) -> list[str]:
    d = cmp["resolve_rate_delta"]
    lines = ["", f"## Comparison: {cmp['other']} vs {cmp['base']}", "",
             f"- shared tasks: {cmp['shared_tasks']}; resolve rate change: {'-' if d is None else f'{100 * d:+.1f} points'}",
             f"- newly solved: {', '.join(cmp['newly_solved']) or 'none'}",
             f"- newly unsolved: {', '.join(cmp['newly_unsolved']) or 'none'}", "", "| k | pass@k change |", "| --- | --- |"]
    lines += [f"| {k} | {100 * v:+.1f} points |" for k, v in cmp["pass_at_k_delta"].items()]
    return lines


def markdown(rep: dict[str, Any], cmp: Optional[dict[str, Any]] = None) -> str:
    """The whole report as Markdown."""
    return "\n".join(_summary_md(rep) + (_compare_md(cmp) if cmp else []) + _tables_md(rep)) + "\n"


def plot_pass_at_k(reports: list[dict[str, Any]], path: Path) -> None:
    """pass@k and pass^k against k, one line pair per report."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for rep in reports:
        ks = list(rep["pass_at_k"])
        ax.plot(ks, [rep["pass_at_k"][k] for k in ks], marker="o", label=f"{rep['name']} pass@k")
        ax.plot(ks, [rep["pass_hat_k"][k] for k in ks], marker="x", linestyle="--", label=f"{rep['name']} pass^k")
    ax.set_xticks(sorted({k for rep in reports for k in rep["pass_at_k"]}))
    ax.set(xlabel="k", ylabel="probability", ylim=(0, 1.02), title="pass@k and pass^k")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_groups(reports: list[dict[str, Any]], path: Path) -> None:
    """Resolve rate per package, one bar per report."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({g for rep in reports for g in rep["per_group"]})
    width = 0.8 / len(reports)
    fig, ax = plt.subplots(figsize=(max(6, len(groups) * 1.2), 4))
    for i, rep in enumerate(reports):
        rates = [(rep["per_group"].get(g) or {}).get("resolve_rate") or 0.0 for g in groups]
        ax.bar([x + i * width for x in range(len(groups))], rates, width, label=rep["name"])
    ax.set_xticks([x + width * (len(reports) - 1) / 2 for x in range(len(groups))], groups, rotation=30, ha="right")
    ax.set(ylabel="resolve rate", ylim=(0, 1.02), title="resolve rate per package")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_all(out: Path, rep: dict[str, Any], other: Optional[dict[str, Any]] = None,
              cmp: Optional[dict[str, Any]] = None) -> list[Path]:
    """report.json, report.md, pass_at_k.png, per_package.png under out; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "report.json", out / "report.md", out / "pass_at_k.png", out / "per_package.png"]
    paths[0].write_text(json.dumps({"report": rep, "other": other, "comparison": cmp}, indent=2))
    paths[1].write_text(markdown(rep, cmp))
    reports = [rep] + ([other] if other else [])
    plot_pass_at_k(reports, paths[2])
    plot_groups(reports, paths[3])
    return paths
