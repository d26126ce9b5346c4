"""Build (once) and locate the native helper `orchard-sandbox` from its C source shipped in the package."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from orchard import errors

SOURCE = Path(__file__).with_name("sandbox_helper.c")


def helper_path(state_dir: Path) -> Path:
    """Path of a helper built from this exact source, compiling it statically if needed."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    target = Path(state_dir) / "bin" / f"orchard-sandbox-{digest}"
    if not target.exists():
        _build(target)
    return target


def _build(target: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise errors.BackendError("The local backend needs a C compiler once to build its helper (apt install gcc libc6-dev)")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    proc = subprocess.run([cc, "-O2", "-static", "-o", str(tmp), str(SOURCE)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise errors.BackendError(f"Building the sandbox helper failed: {proc.stderr.strip()[-2000:]}")
    os.replace(tmp, target)
