"""Shared fixtures: one real SmolLM2 tokenizer (and, for the local engine, one loaded model) per test session."""

from __future__ import annotations

import pytest

from orchard.inference.chat import ChatTokenizer


@pytest.fixture(scope="session")
def tokenizer() -> ChatTokenizer:
    from orchard.inference.weights import load_tokenizer

    return load_tokenizer()


TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
