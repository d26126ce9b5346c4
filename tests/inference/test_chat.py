"""The chat format over the real SmolLM2 tokenizer: rendering, exact ids, per-token bytes."""

from __future__ import annotations

import pytest

from orchard.errors import RequestError
from orchard.inference import hermes

from .conftest import TOOLS


def test_prompt_ids_equal_tokenizing_the_whole_text(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "List files."},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command":"ls"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "a.txt\nb.txt"}]
    text = tokenizer.render(messages, TOOLS)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools") and text.endswith("<|im_start|>assistant\n")
    assert '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>' in text
    assert "<|im_start|>user\n<tool_response>\na.txt\nb.txt\n</tool_response><|im_end|>" in text
    ids = tokenizer.prompt_ids(messages, TOOLS)
    assert ids == tokenizer.backend.encode(text, add_special_tokens=False).ids
    assert tokenizer.decode(ids) == text


def test_default_system_line_is_the_models(tokenizer):
    text = tokenizer.render([{"role": "user", "content": "hi"}])
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_next_prompt_extends_prompt_plus_completion(tokenizer):
    """What stitching relies on: the assistant turn renders back to exactly the ids the server emitted."""
    first = [{"role": "user", "content": "Make a file."}]
    reply = hermes.render_turn("Sure.", [("bash", {"command": "echo hi > f"})])
    prompt, completion = tokenizer.prompt_ids(first, TOOLS), tokenizer.completion_ids(reply)
    call = {"id": "x", "type": "function", "function": {"name": "bash", "arguments": '{"command": "echo hi > f"}'}}
    second = first + [{"role": "assistant", "content": "Sure.", "tool_calls": [call]},
                      {"role": "tool", "tool_call_id": "x", "content": ""}]
    assert tokenizer.prompt_ids(second, TOOLS)[:len(prompt) + len(completion)] == prompt + completion


def test_pieces_carry_exact_bytes(tokenizer):
    ids = tokenizer.encode("héllo 世界<|im_end|>")
    assert ids[-1] == tokenizer.end_of_turn_id
    assert b"".join(bytes(tokenizer.piece(i)[1]) for i in ids) == "héllo 世界<|im_end|>".encode()


def test_text_parts_and_bad_parts(tokenizer):
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert "user\nab<|im_end|>" in tokenizer.render([{"role": "user", "content": parts}])
    with pytest.raises(RequestError, match="image_url"):
        tokenizer.render([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    with pytest.raises(RequestError):
        tokenizer.render([])
