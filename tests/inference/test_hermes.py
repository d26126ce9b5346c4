"""The Hermes tool-call format: rendering and parsing."""

from __future__ import annotations

import json

from orchard.inference import hermes


def test_render_then_parse_round_trips():
    text = hermes.render_turn("Let me look.", [("bash", {"command": "ls -la"}), ("read", '{"path": "a.txt"}')])
    assert text == ('Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>\n'
                    '<tool_call>\n{"name": "read", "arguments": {"path": "a.txt"}}\n</tool_call>')
    content, calls = hermes.parse(text)
    assert content == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("bash", {"command": "ls -la"}), ("read", {"path": "a.txt"})]


def test_text_without_calls_is_kept_verbatim():
    assert hermes.parse("  just text\n") == ("  just text\n", [])
    assert hermes.parse("") == (None, [])


def test_call_only_has_no_content():
    content, calls = hermes.parse('<tool_call>\n{"name": "done", "arguments": {}}\n</tool_call>')
    assert content is None and calls[0].name == "done" and calls[0].arguments == "{}"


def test_malformed_blocks_stay_text():
    bad = '<tool_call>\n{"name": "bash", "arguments": {\n</tool_call>'
    assert hermes.parse(bad) == (bad, [])
    no_name = '<tool_call>\n{"arguments": {}}\n</tool_call>'
    assert hermes.parse(no_name) == (no_name, [])
    unclosed = '<tool_call>\n{"name": "bash", "arguments": {}}'
    assert hermes.parse(unclosed) == (unclosed, [])


def test_lenient_whitespace_and_parameters_key():
    content, calls = hermes.parse('x<tool_call>{"name": "f", "parameters": {"a": 1}}</tool_call>y')
    assert content == "xy" and calls[0].name == "f" and json.loads(calls[0].arguments) == {"a": 1}


def test_unicode_arguments_stay_readable():
    assert "é" in hermes.render_call("f", {"s": "é"})
