"""Build a SWE task image: a package's source and test dependencies installed in a sandbox, then snapshotted.

The builder downloads the sdist and the test dependencies' wheels on the host (pip, with its usual
index configuration) and installs them in a sandbox with no network, so an image builds the same
way whether or not sandboxes can reach PyPI. The snapshot's name is the task image.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field

from orchard import errors

RECIPES_FILE = Path(__file__).parent / "data" / "images.json"
CACHE = Path.home() / ".cache" / "orchard" / "wheelhouse"
STAGE = "/tmp/.orchard_image"
VENV = "/opt/venv"


class ImageRecipe(BaseModel):
    """How one package's task image is made."""

    model_config = ConfigDict(extra="forbid")

    image: str = Field(description="Snapshot name, e.g. 'orchard-swe-toolz:1.2.0'.")
    package: str = Field(description="PyPI project name.")
    version: str = Field(description="The release whose sdist is used.")
    repo_dir: str = Field(description="Where the source lands in the image, e.g. /workspace/toolz.")
    import_root: str = Field(".", description="Folder (relative to repo_dir) put on sys.path, e.g. 'src'.")
    test_deps: list[str] = Field(default_factory=list, description="Requirements installed for the tests.")


def recipes(path: Path = RECIPES_FILE) -> dict[str, ImageRecipe]:
    """Every known task image, by name."""
    if not path.exists():
        return {}
    return {r["image"]: ImageRecipe.model_validate(r) for r in json.loads(path.read_text())}


def is_buildable(image: str) -> bool:
    return image in recipes()


def recipe_for(image: str) -> ImageRecipe:
    found = recipes().get(image)
    if found is None:
        raise errors.TaskError(f"No recipe for image {image!r} (known: {', '.join(recipes()) or 'none'})")
    return found


def download(recipe: ImageRecipe, cache: Path = CACHE) -> Path:
    """The sdist and test-dependency wheels in a host folder (downloaded once)."""
    folder = cache / recipe.image.replace(":", "-").replace("/", "-")
    done = folder / ".complete"
    if done.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "-q", "-d", str(folder)]
    _run(pip + ["--no-deps", "--no-binary", ":all:", f"{recipe.package}=={recipe.version}"])
    if recipe.test_deps:
        _run(pip + ["--only-binary", ":all:"] + recipe.test_deps)
    done.touch()
    return folder


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise errors.TaskError(f"{' '.join(argv)} failed: {proc.stderr[-1500:]}")


def install_script(recipe: ImageRecipe, sdist: str, wheels: list[str]) -> str:
    """The commands that turn a bare `host` sandbox into the task image."""
    reqs = " ".join(f"'{r}'" for r in recipe.test_deps)
    install = f"{VENV}/bin/pip install -q --no-index --find-links {STAGE} {reqs}" if wheels else "true"
    return "\n".join([
        "set -euo pipefail",
        f"python3 -m venv {VENV}",
        install,
        f"mkdir -p {recipe.repo_dir} && tar xzf {STAGE}/{sdist} --no-same-owner -C {recipe.repo_dir} --strip-components=1",
        f"site=$({VENV}/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')",
        f"echo {recipe.repo_dir}/{recipe.import_root} > $site/orchard_task_source.pth",
        # wrappers, not symlinks: a symlinked venv python would not find its pyvenv.cfg
        f"for b in python python3 pytest pip; do printf '#!/bin/sh\\nexec {VENV}/bin/%s \"$@\"\\n' $b "
        f"> /usr/local/bin/$b; chmod +x /usr/local/bin/$b; done",
        f"rm -rf {STAGE}",
    ])


def _staged(recipe: ImageRecipe, folder: Path) -> tuple[str, list[Path]]:
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    sdists = [p for p in files if p.name.endswith(".tar.gz")]
    if len(sdists) != 1:
        raise errors.TaskError(f"{folder}: expected one sdist, found {[p.name for p in sdists]}")
    return sdists[0].name, files


def build_image(client: Any, image: str, cache: Path = CACHE) -> str:
    """Build (or rebuild) a task image with a sync SandboxClient; returns its name."""
    recipe = recipe_for(image)
    sdist, files = _staged(recipe, download(recipe, cache))
    with client.create_sandbox("host", block_network=True) as sandbox:
        for f in files:
            sandbox.upload_file(f, f"{STAGE}/{f.name}")
        script = install_script(recipe, sdist, [f.name for f in files if f.suffix == ".whl"])
        result = sandbox.exec(script, timeout=600)
        if result.exit_code != 0:
            raise errors.TaskError(f"building {image} failed: {(result.stdout + result.stderr)[-2000:]}")
        sandbox.snapshot(image)
    return image


async def abuild_image(client: Any, image: str, cache: Optional[Path] = None) -> str:
    """Async twin of build_image (the host-side download runs off the event loop)."""
    import asyncio

    recipe = recipe_for(image)
    folder = await asyncio.to_thread(download, recipe, cache or CACHE)
    sdist, files = _staged(recipe, folder)
    sandbox = await client.create_sandbox("host", block_network=True)
    try:
        for f in files:
            await sandbox.upload_file(f, f"{STAGE}/{f.name}")
        result = await sandbox.exec(install_script(recipe, sdist, [f.name for f in files if f.suffix == ".whl"]),
                                    timeout=600)
        if result.exit_code != 0:
            raise errors.TaskError(f"building {image} failed: {(result.stdout + result.stderr)[-2000:]}")
        await sandbox.snapshot(image)
    finally:
        await sandbox.delete()
    return image
