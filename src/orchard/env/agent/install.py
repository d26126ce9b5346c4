"""The init container's step: copy the agent home into the pod's shared volume and leave the token for the agent.

Runs in the agent image as ``python3 -I -c <boot_code('install')> <home copy> <token dir>``: the
interpreter and this package (everything under HOME) go to the first directory, which the sandbox
container mounts read-only at HOME; the token (from the init container's environment, filled from
the sandbox's Secret) goes to a file in the second, an in-memory volume the agent empties as its
first act. The file is world-readable because the sandbox image may run as another user than this
image; no process of the sandbox exists before the agent has read and deleted it.
"""

from __future__ import annotations

import os
import shutil
import sys

from . import HOME, TOKEN_ENV


def install(source: str, target: str, token_dir: str, token: str) -> None:
    shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
    path = os.path.join(token_dir, "token")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o444)
    with os.fdopen(fd, "w") as f:
        f.write(token)


def main() -> None:
    if len(sys.argv) != 3 or not os.environ.get(TOKEN_ENV):
        sys.exit(f"usage: install <home copy> <token dir>, with ${TOKEN_ENV} set")
    install(os.environ.get("ORCHARD_AGENT_SOURCE", HOME), sys.argv[1], sys.argv[2], os.environ[TOKEN_ENV])
