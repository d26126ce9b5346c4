"""The writable layer of a local sandbox: a size-limited tmpfs (the default) or a plain directory on disk.

A tmpfs layer bounds what a sandbox can write (a disk filler gets ENOSPC, never the host's disk),
its pages are charged to the sandbox's memory cgroup, and deleting it is one unmount.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Optional

from orchard import errors

MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def make_layer(path: Path, size: Optional[int], tmpfs: bool) -> None:
    """Create the layer directory; mount a tmpfs of `size` bytes on it when asked."""
    path.mkdir(parents=True, mode=0o700)
    if not tmpfs:
        return
    opts = f"size={size},mode=0700" if size else "mode=0700"
    if _libc.mount(b"orchard-layer", str(path).encode(), b"tmpfs", 0, opts.encode()) != 0:
        err = ctypes.get_errno()
        raise errors.BackendError(f"Cannot mount the sandbox's writable layer at {path}: {os.strerror(err)}")


def drop_layer(path: Path) -> None:
    """Unmount the layer if it is a mount (lazily: nothing may hold it up)."""
    if os.path.ismount(path):
        if _libc.umount2(str(path).encode(), MNT_DETACH) != 0:
            err = ctypes.get_errno()
            raise errors.BackendError(f"Cannot unmount {path}: {os.strerror(err)}")


def mounted_layers(root: Path) -> list[Path]:
    """Layer mounts under root (for leak checks)."""
    prefix = str(root).rstrip("/") + "/"
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f]
    return [Path(p) for p in points if p.startswith(prefix) and p.endswith("/layer")]
