"""Evaluation of rollout runs: resolve rate, pass@k, pass^k, per-task and per-package tables, run comparison."""

from orchard.eval.metrics import pass_at_k, pass_hat_k
from orchard.eval.report import build_report, compare_reports, load_run

__all__ = ["pass_at_k", "pass_hat_k", "build_report", "compare_reports", "load_run"]
