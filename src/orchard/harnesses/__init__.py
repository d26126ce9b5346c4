"""Harness adapters: install a harness into the tools folder, launch it in a sandbox against a proxy session, judge its end."""

from __future__ import annotations

from orchard.errors import HarnessError
from orchard.harnesses.base import Budget, Endpoint, Harness, HarnessResult, Launch
from orchard.harnesses.claude_code import ClaudeCode
from orchard.harnesses.codex import Codex
from orchard.harnesses.mini_swe_agent import MiniSweAgent
from orchard.harnesses.minimal import Minimal
from orchard.harnesses.opencode import OpenCode
from orchard.harnesses.run import arun_harness, run_harness

HARNESSES: dict[str, Harness] = {h.name: h for h in (Codex(), ClaudeCode(), OpenCode(), MiniSweAgent(), Minimal())}


def get_harness(name: str) -> Harness:
    """The adapter called ``name``; HarnessError listing the known ones otherwise."""
    try:
        return HARNESSES[name]
    except KeyError:
        raise HarnessError(f"Unknown harness {name!r}; known: {', '.join(HARNESSES)}") from None


__all__ = ["HARNESSES", "Budget", "Endpoint", "Harness", "HarnessResult", "Launch", "arun_harness", "get_harness", "run_harness"]
