"""Evaluation: the estimators against brute force, the report's figures, comparison, and the written files."""

from __future__ import annotations

import itertools
import json
from math import isclose

import pytest

from orchard.cli import main
from orchard.errors import RequestError
from orchard.eval import build_report, compare_reports, load_run, pass_at_k, pass_hat_k

from tests.eval.runs import make_run


@pytest.mark.parametrize("n,c", [(5, 0), (5, 1), (5, 3), (5, 5), (8, 2)])
def test_estimators_match_enumeration_of_subsets(n, c):
    outcomes = [True] * c + [False] * (n - c)
    for k in range(1, n + 1):
        subsets = list(itertools.combinations(outcomes, k))
        assert isclose(pass_at_k(n, c, k), sum(any(s) for s in subsets) / len(subsets))
        assert isclose(pass_hat_k(n, c, k), sum(all(s) for s in subsets) / len(subsets))


def test_estimators_refuse_impossible_counts():
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_hat_k(3, 1, 4)


def test_report_excludes_infrastructure_failures(tmp_path):
    run = make_run(tmp_path / "a", {"six-1": [True, False, "sandbox"], "six-2": [False, False, False],
                                    "toolz-1": [True, True, "upstream"]})
    rep = build_report(load_run(run), name="a")
    assert rep["rollouts"] == 9 and rep["scored"] == 7
    assert rep["infra_failures"] == {"sandbox": 1, "upstream": 1}
    assert isclose(rep["resolve_rate"], 3 / 7)
    assert list(rep["pass_at_k"]) == [1, 2]                      # smallest scored n is 2
    assert isclose(rep["pass_at_k"][1], (1 / 2 + 0 + 1) / 3)
    assert isclose(rep["pass_at_k"][2], (1 + 0 + 1) / 3)
    assert isclose(rep["pass_hat_k"][2], (0 + 0 + 1) / 3)
    assert rep["per_group"]["six"] == {"tasks": 2, "n": 5, "c": 1, "resolve_rate": 0.2}
    assert rep["per_task"]["six-1"]["infra"] == 1


def test_compare_two_runs(tmp_path):
    a = build_report(load_run(make_run(tmp_path / "a", {"t-1": [False, False], "t-2": [True, True]})), "a")
    b = build_report(load_run(make_run(tmp_path / "b", {"t-1": [True, False], "t-2": [False, False]})), "b")
    cmp = compare_reports(a, b)
    assert cmp["newly_solved"] == ["t-1"] and cmp["newly_unsolved"] == ["t-2"]
    assert isclose(cmp["resolve_rate_delta"], 0.25 - 0.5)
    assert isclose(cmp["pass_at_k_delta"][1], 0.25 - 0.5)


def test_cli_writes_json_markdown_and_plots(tmp_path, capsys):
    a = make_run(tmp_path / "a", {"six-1": [True, False], "toolz-1": [True, True]})
    b = make_run(tmp_path / "b", {"six-1": [False, False], "toolz-1": [True, "grader"]})
    assert main(["eval", str(a), "--compare", str(b), "--out", str(tmp_path / "out")]) == 0
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["report"]["resolve_rate"] == 0.75 and data["comparison"]["newly_unsolved"] == ["six-1"]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| 1 | 75.0% | 75.0% |" in md and "| six | 1 | 2 | 1 | 50.0% |" in md
    for png in ("pass_at_k.png", "per_package.png"):
        assert (tmp_path / "out" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "resolve rate: 75.0%" in capsys.readouterr().out


def test_not_a_run_is_a_clear_error(tmp_path):
    with pytest.raises(RequestError, match="orchard rollout"):
        load_run(tmp_path)
