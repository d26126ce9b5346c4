"""Installing harnesses into the tools folder that every sandbox sees read-only at /opt/orchard/tools.

Layout: one directory per harness (``codex/``, ``claude-code/``, ``opencode/``: npm prefixes;
``mini-swe-agent/``: a pip ``--target`` tree; ``minimal/``: one script), each marked complete by
``.orchard-installed`` holding what was installed, and ``bin/`` with one relative symlink or
wrapper per command, so the folder works at any path (on the host and at /opt/orchard/tools).
Each install happens in a temporary directory renamed into place, under a lock: idempotent and
safe to run from several processes.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from orchard.errors import HarnessError

MARKER = ".orchard-installed"
SANDBOX_PYTHON = "/usr/bin/python3"   # what the sandbox's `host` image runs (the host's /usr)


def default_tools_dir() -> Path:
    """ORCHARD_TOOLS_DIR, else ~/.cache/orchard/tools."""
    env = os.environ.get("ORCHARD_TOOLS_DIR")
    return Path(env) if env else Path.home() / ".cache" / "orchard" / "tools"


def is_installed(tools_dir: Path, name: str, spec: str) -> bool:
    """Whether ``<tools_dir>/<name>`` holds exactly ``spec``."""
    marker = tools_dir / name / MARKER
    return marker.is_file() and marker.read_text().strip() == spec


@contextmanager
def _locked(tools_dir: Path) -> Iterator[None]:
    tools_dir.mkdir(parents=True, exist_ok=True)
    with open(tools_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def install_tree(tools_dir: Path, name: str, spec: str, fill, bins: dict[str, str]) -> None:
    """Run ``fill(tmpdir)`` into a fresh directory, rename it to ``<tools_dir>/<name>``, link ``bins``.

    ``bins`` maps a command name to its path relative to ``<tools_dir>/<name>``.
    """
    tools_dir = tools_dir.resolve()
    with _locked(tools_dir):
        if not is_installed(tools_dir, name, spec):
            tmp = tools_dir / f".tmp-{name}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            fill(tmp)
            (tmp / MARKER).write_text(spec + "\n")
            _replace(tmp, tools_dir / name)
        for command, rel in bins.items():
            _link(tools_dir, command, f"../{name}/{rel}")


def _replace(tmp: Path, final: Path) -> None:
    old = final.with_name(f".old-{final.name}")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def _link(tools_dir: Path, command: str, target: str) -> None:
    bin_dir = tools_dir / "bin"
    bin_dir.mkdir(exist_ok=True)
    link = bin_dir / command
    if link.is_symlink() and os.readlink(link) == target:
        return
    tmp = bin_dir / f".{command}.tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    tmp.replace(link)


def run(argv: list[str], what: str, cwd: Optional[Path] = None, timeout: float = 1800) -> str:
    """Run an install step; HarnessError with its output's tail when it fails."""
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise HarnessError(f"{what}: {argv[0]} is not installed") from e
    except subprocess.TimeoutExpired as e:
        raise HarnessError(f"{what}: timed out after {timeout:g}s") from e
    if done.returncode != 0:
        raise HarnessError(f"{what} failed (exit {done.returncode}): {(done.stderr or done.stdout)[-1500:]}")
    return done.stdout


def npm_fill(package: str, version: str):
    """A fill step: ``npm install --prefix <dir> package@version`` (with its platform binaries)."""
    def fill(tmp: Path) -> None:
        npm = shutil.which("npm")
        if npm is None:
            raise HarnessError(f"installing {package} needs npm (Node.js 20+: apt install nodejs npm)")
        run([npm, "install", "--prefix", str(tmp), "--no-audit", "--no-fund", "--no-update-notifier",
             "--loglevel=error", f"{package}@{version}"], f"npm install {package}@{version}")
    return fill


def pip_fill(requirement: str):
    """A fill step: ``pip install --target <dir> requirement`` for the sandbox's python3 (wheels only if it differs)."""
    def fill(tmp: Path) -> None:
        argv = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                "--target", str(tmp), *_abi_flags(), requirement]
        run(argv, f"pip install {requirement}")
    return fill


def _abi_flags() -> list[str]:
    """Pick wheels for the sandbox's python3 when it is not the Python running pip."""
    probe = subprocess.run([SANDBOX_PYTHON, "-c", "import sys; print('%d%d' % sys.version_info[:2])"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        raise HarnessError(f"{SANDBOX_PYTHON} is missing: sandboxes of the host image run Python tools with it")
    theirs, ours = probe.stdout.strip(), "%d%d" % sys.version_info[:2]
    if theirs == ours:
        return []
    return ["--only-binary=:all:", "--python-version", theirs, "--implementation", "cp", "--abi", f"cp{theirs}"]


def check(tools_dir: Path, command: str, args: tuple[str, ...] = ("--version",)) -> str:
    """Run ``bin/<command> --version`` on the host: proof the install works; its output."""
    path = tools_dir / "bin" / command
    return run([str(path), *args], f"{command} {' '.join(args)}", timeout=120).strip()
