"""AST-level mutation operators that inject one small bug into a Python source file.

Each operator finds AST nodes it can change and edits only the characters of that node in the
source text (never re-printing the file), so the bug and its inverse are one-line diffs.
"""

from __future__ import annotations

import ast
import difflib
import re
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

COMPARE_FLIPS = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
                 ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.In: ("in", "not in"),
                 ast.NotIn: ("not in", "in"), ast.Is: ("is", "is not"), ast.IsNot: ("is not", "is")}
ARITH_FLIPS = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "//"), ast.FloorDiv: ("//", "*")}


@dataclass(frozen=True)
class Mutation:
    """One injected bug: where it is, which operator made it, and the source before and after."""

    path: str           # file path relative to the repository root
    operator: str       # compare, boolean, negation, off_by_one, arithmetic, drop_statement, return_value, ...
    line: int
    original: str       # the whole file before
    mutated: str        # the whole file after

    @property
    def key(self) -> str:
        return f"{self.path}:{self.line}:{self.operator}:{hash(self.mutated) & 0xffffffff:08x}"

    def bug_patch(self) -> str:
        """The diff that introduces the bug (applied by a task's setup)."""
        return unified_diff(self.path, self.original, self.mutated)

    def gold_patch(self) -> str:
        """The inverse: the diff that fixes it."""
        return unified_diff(self.path, self.mutated, self.original)


def unified_diff(path: str, before: str, after: str) -> str:
    """A git-style unified diff (a/ b/ prefixes) that `git apply` accepts at the repository root."""
    lines = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                 fromfile=f"a/{path}", tofile=f"b/{path}", n=3)
    text = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
    return f"diff --git a/{path} b/{path}\n{text}" if text else ""


class _Source:
    """Source text with AST (line, byte column) positions turned into string offsets."""

    def __init__(self, text: str):
        self.text = text
        self.lines = text.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1]
        return self.starts[lineno - 1] + len(line.encode("utf-8")[:col].decode("utf-8", "ignore"))

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset))

    def replace(self, start: int, end: int, new: str) -> str:
        return self.text[:start] + new + self.text[end:]


Edit = tuple[int, int, str]            # (start, end, replacement) in string offsets


def _gap_edit(src: _Source, left: ast.AST, right: ast.AST, old: str, new: str) -> Optional[Edit]:
    """Replace the operator token `old` found between two operands (same line only)."""
    if left.end_lineno != right.lineno:
        return None
    start, end = src.offset(left.end_lineno, left.end_col_offset), src.offset(right.lineno, right.col_offset)
    gap = src.text[start:end]
    pattern = r"(?<![\w<>=!*/])" + r"\s+".join(map(re.escape, old.split())) + r"(?![\w<>=*/])"
    found = list(re.finditer(pattern, gap))
    if len(found) != 1:
        return None
    return start + found[0].start(), start + found[0].end(), new


def op_compare(src: _Source, node: ast.AST) -> Iterator[Edit]:
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in COMPARE_FLIPS:
        old, new = COMPARE_FLIPS[type(node.ops[0])]
        edit = _gap_edit(src, node.left, node.comparators[0], old, new)
        if edit:
            yield edit


def op_boolean(src: _Source, node: ast.AST) -> Iterator[Edit]:
    if isinstance(node, ast.BoolOp) and len(node.values) == 2:
        old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
        edit = _gap_edit(src, node.values[0], node.values[1], old, new)
        if edit:
            yield edit


def op_negation(src: _Source, node: ast.AST) -> Iterator[Edit]:
    """`not x` becomes `x`."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) and node.lineno == node.operand.lineno:
        start, _ = src.span(node)
        op_end = src.offset(node.operand.lineno, node.operand.col_offset)
        if re.fullmatch(r"not\s+", src.text[start:op_end]):
            yield start, op_end, ""


def op_off_by_one(src: _Source, node: ast.AST) -> Iterator[Edit]:
    """A small integer literal n becomes n + 1 (and n - 1 when positive)."""
    if isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value <= 64:
        start, end = src.span(node)
        if src.text[start:end] == str(node.value):
            yield start, end, str(node.value + 1)
            if node.value > 0:
                yield start, end, str(node.value - 1)


def op_arithmetic(src: _Source, node: ast.AST) -> Iterator[Edit]:
    if isinstance(node, ast.BinOp) and type(node.op) in ARITH_FLIPS:
        old, new = ARITH_FLIPS[type(node.op)]
        edit = _gap_edit(src, node.left, node.right, old, new)
        if edit:
            yield edit


def op_return_value(src: _Source, node: ast.AST) -> Iterator[Edit]:
    """`return True` <-> `return False`; any other returned value becomes None."""
    if not isinstance(node, ast.Return) or node.value is None or node.lineno != node.value.end_lineno:
        return
    start, end = src.span(node.value)
    value = node.value
    if isinstance(value, ast.Constant) and isinstance(value.value, bool):
        yield start, end, str(not value.value)
    elif not (isinstance(value, ast.Constant) and value.value is None):
        yield start, end, "None"


def op_loop_control(src: _Source, node: ast.AST) -> Iterator[Edit]:
    if isinstance(node, (ast.Break, ast.Continue)):
        start, end = src.span(node)
        yield start, end, "continue" if isinstance(node, ast.Break) else "break"


OPERATORS: dict[str, Callable[[_Source, ast.AST], Iterator[Edit]]] = {
    "compare": op_compare, "boolean": op_boolean, "negation": op_negation, "off_by_one": op_off_by_one,
    "arithmetic": op_arithmetic, "return_value": op_return_value, "loop_control": op_loop_control,
}


def _droppable(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Simple one-line statements in a block that keeps at least one other statement (docstrings excluded)."""
    if len(body) < 2:
        return
    for i, stmt in enumerate(body):
        is_doc = i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
        if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.Expr)) and not is_doc and stmt.lineno == stmt.end_lineno:
            yield stmt


def drop_statements(src: _Source, tree: ast.AST) -> Iterator[tuple[int, Edit]]:
    """Whole lines holding one droppable statement are removed."""
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            for stmt in _droppable(body if isinstance(body, list) else []):
                line = src.lines[stmt.lineno - 1]
                start, end = src.span(stmt)
                line_start = src.starts[stmt.lineno - 1]
                if line[: start - line_start].strip() or line[end - line_start:].strip().split("#")[0].strip():
                    continue
                yield stmt.lineno, (line_start, src.starts[stmt.lineno], "")


def _in_scope(node: ast.AST, skip: set[int]) -> bool:
    return getattr(node, "lineno", None) is not None and node.lineno not in skip


def _skipped_lines(tree: ast.AST) -> set[int]:
    """Lines not worth mutating: module docstring, `if __name__ == ...`, `TYPE_CHECKING` blocks, type hints."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test) or (
                isinstance(node, ast.If) and "__name__" in ast.dump(node.test)):
            skip.update(range(node.lineno, node.end_lineno + 1))
        for attr in ("returns", "annotation"):
            hint = getattr(node, attr, None)
            if hint is not None:
                skip.update(range(hint.lineno, hint.end_lineno + 1))
    return skip


def mutations(path: str, text: str, operators: Optional[list[str]] = None) -> list[Mutation]:
    """Every single-edit mutation of one file that still parses, in source order."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    src, skip, chosen = _Source(text), _skipped_lines(tree), operators or list(OPERATORS) + ["drop_statement"]
    out: list[Mutation] = []
    for node in ast.walk(tree):
        if not _in_scope(node, skip):
            continue
        for name in chosen:
            if name in OPERATORS:
                out.extend(_make(path, name, node.lineno, src, e) for e in OPERATORS[name](src, node))
    if "drop_statement" in chosen:
        out.extend(_make(path, "drop_statement", line, src, e) for line, e in drop_statements(src, tree)
                   if line not in skip)
    return sorted({m.mutated: m for m in out if m is not None and _parses(m.mutated)}.values(),
                  key=lambda m: (m.line, m.operator, m.mutated))


def _make(path: str, operator: str, line: int, src: _Source, edit: Edit) -> Optional[Mutation]:
    start, end, new = edit
    mutated = src.replace(start, end, new)
    return None if mutated == src.text else Mutation(path, operator, line, src.text, mutated)


def _parses(text: str) -> bool:
    try:
        ast.parse(text)
    except SyntaxError:
        return False
    return True
