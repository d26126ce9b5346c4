"""Parsing test outcomes and judging a grade, without a sandbox."""

from orchard.tasks.outcomes import judge_tests, parse_ra, parse_report

RA = """
=========================== short test summary info ============================
PASSED tests/test_a.py::test_ok
PASSED tests/test_a.py::test_param[a b]
FAILED tests/test_a.py::test_bad - AssertionError: assert 1 == 2
ERROR tests/test_b.py::test_setup - RuntimeError
SKIPPED [1] tests/test_c.py:3: no
XFAIL tests/test_a.py::test_x - reason
"""


def test_parse_ra_reads_the_short_summary():
    out = parse_ra(RA)
    assert out["tests/test_a.py::test_ok"] == "passed"
    assert out["tests/test_a.py::test_param[a b]"] == "passed"
    assert out["tests/test_a.py::test_bad"] == "failed"
    assert out["tests/test_b.py::test_setup"] == "error"
    assert out["tests/test_a.py::test_x"] == "xfailed"


def test_parse_report_tolerates_garbage():
    assert parse_report('{"t::a": "passed"}') == {"t::a": "passed"}
    assert parse_report("") == {} and parse_report("not json") == {} and parse_report("[1]") == {}


def test_judge_needs_every_listed_test_to_pass_and_missing_counts_as_failed():
    outcomes = {"a": "passed", "b": "passed", "c": "failed"}
    assert judge_tests(["a"], ["b"], outcomes)[0] == "resolved"
    assert judge_tests(["a"], ["c"], outcomes)[0] == "unresolved"
    status, f2p, _ = judge_tests(["zz"], [], outcomes)
    assert status == "unresolved" and f2p == {"zz": "missing"}
