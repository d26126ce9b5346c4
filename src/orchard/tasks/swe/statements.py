"""Write a problem statement the way a user reports a bug: the symptom and a reproduction, never the fix.

Everything comes from what the failing tests show from outside: their code (the reproduction),
the error they raise, and the public names they call. Nothing is taken from the mutation itself
(no file, line, operator or diff).
"""

from __future__ import annotations

import ast
import hashlib
import textwrap
from dataclasses import dataclass

MAX_REPRO_LINES = 40
MAX_ERROR_CHARS = 600


@dataclass(frozen=True)
class FailingTest:
    """A test that fails with the bug: its id, its source code and the error it reported."""

    test_id: str
    source: str
    error: str


def source_of_test(file_text: str, test_id: str) -> str:
    """The source of the test function (or method) a pytest node id names; '' if not found."""
    parts = test_id.split("::")[1:]
    if not parts:
        return ""
    names = [p.split("[")[0] for p in parts]
    try:
        scope: list[ast.stmt] = ast.parse(file_text).body
    except SyntaxError:
        return ""
    node = None
    for name in names:
        node = next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name == name), None)
        if node is None:
            return ""
        scope = node.body
    return textwrap.dedent(ast.get_source_segment(file_text, node, padded=True) or "")


def called_names(source: str, public: set[str]) -> list[str]:
    """Public names of the package the test calls, in order of first use."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return []
    seen: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if name in public and name not in seen and not name.startswith("_"):
                seen.append(name)
    return seen


def _trim(text: str, lines: int) -> str:
    rows = text.rstrip().splitlines()
    return "\n".join(rows[:lines] + (["    ..."] if len(rows) > lines else []))


def _error(text: str) -> str:
    text = text.strip() or "(the test fails without a message)"
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + " ..."


TITLES = (
    "`{name}` returns the wrong result",
    "Unexpected behaviour in `{name}`",
    "`{name}` no longer behaves as documented",
    "Bug: `{name}` gives an incorrect answer",
)
OPENINGS = (
    "I'm using {package} {version} and ran into what looks like a bug{where}.",
    "After installing {package} {version}, some code of mine started misbehaving{where}.",
    "There seems to be a regression in {package} {version}{where}.",
)
CLOSINGS = (
    "I'd expect the assertions above to hold.",
    "Expected: the code above runs without errors.",
    "This used to work, and the behaviour above looks wrong to me.",
)


def _pick(options: tuple[str, ...], seed: str, salt: str) -> str:
    digest = hashlib.sha256((seed + salt).encode()).digest()
    return options[digest[0] % len(options)]


def write_statement(package: str, version: str, failing: list[FailingTest], public: set[str], seed: str) -> str:
    """A bug report from the first failing test's code and error, mentioning how many tests fail."""
    first = failing[0]
    names = called_names(first.source, public)
    where = f" when calling `{names[0]}`" if names else ""
    title = _pick(TITLES, seed, "t").format(name=names[0]) if names else f"Wrong results from {package}"
    body = [f"# {title}", "",
            _pick(OPENINGS, seed, "o").format(package=package, version=version, where=where), "",
            "Here is a reproduction (taken from the project's own test suite):", "",
            "```python", _trim(first.source, MAX_REPRO_LINES) or f"# run the test {first.test_id}", "```", ""]
    if "[" in first.test_id:
        body += [f"The failing case is `{first.test_id}`.", ""]
    body += ["Running it fails with:", "", "```", _error(first.error), "```", ""]
    if len(failing) > 1:
        others = ", ".join(f"`{f.test_id}`" for f in failing[1:4])
        more = f" and {len(failing) - 4} more" if len(failing) > 4 else ""
        body += [f"Other tests in the suite fail as well: {others}{more}.", ""]
    body.append(_pick(CLOSINGS, seed, "c"))
    return "\n".join(body) + "\n"
