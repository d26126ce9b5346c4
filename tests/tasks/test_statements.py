"""Problem statements read like bug reports: symptom and reproduction from the failing test, never the fix."""

from orchard.tasks.swe.statements import FailingTest, called_names, source_of_test, write_statement

TEST_FILE = '''import pytest
from pkg import clamp


def helper():
    return 1


class TestClamp:
    def test_low(self):
        assert clamp(-1, 0, 10) == 0

    @pytest.mark.parametrize("x", [11, 12])
    def test_high(self, x):
        assert clamp(x, 0, 10) == 10
'''


def test_source_finds_methods_and_parametrized_tests():
    assert "clamp(-1, 0, 10)" in source_of_test(TEST_FILE, "tests/test_c.py::TestClamp::test_low")
    src = source_of_test(TEST_FILE, "tests/test_c.py::TestClamp::test_high[11]")
    assert src.startswith("@pytest.mark.parametrize") or src.startswith("def test_high")
    assert source_of_test(TEST_FILE, "tests/test_c.py::missing") == ""
    assert source_of_test(TEST_FILE, "tests/test_c.py") == ""


def test_called_names_keeps_public_package_names_only():
    assert called_names("assert clamp(1, 2, 3) == len([1])", {"clamp", "_hidden"}) == ["clamp"]


def statement(failing):
    return write_statement("pkg", "1.0", failing, {"clamp"}, seed="pkg-1")


def test_statement_has_symptom_reproduction_and_scale():
    failing = [FailingTest("tests/test_c.py::TestClamp::test_high[11]",
                           source_of_test(TEST_FILE, "tests/test_c.py::TestClamp::test_high[11]"),
                           "AssertionError: assert 11 == 10"),
               FailingTest("tests/test_c.py::TestClamp::test_high[12]", "", "AssertionError: assert 12 == 10")]
    text = statement(failing)
    assert "`clamp`" in text and "pkg 1.0" in text
    assert "assert clamp(x, 0, 10) == 10" in text                     # the reproduction
    assert "AssertionError: assert 11 == 10" in text                  # the symptom
    assert "test_high[11]" in text and "test_high[12]" in text        # the failing case and the other test


def test_statement_never_shows_a_diff_or_a_source_location():
    text = statement([FailingTest("t.py::test_x", "def test_x():\n    assert clamp(1, 2, 3) == 2\n", "boom")])
    for leak in ("diff --git", "@@", "+++", "---", ".py:", "line "):
        assert leak not in text


def test_statement_is_deterministic_per_seed_and_survives_missing_source():
    failing = [FailingTest("t.py::test_x", "", "")]
    assert statement(failing) == statement(failing)
    assert "run the test t.py::test_x" in statement(failing)
    assert "fails without a message" in statement(failing)
