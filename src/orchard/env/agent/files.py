"""File operations of the agent: read, write (with parents and mode) and list, as the sandbox's own user."""

from __future__ import annotations

import datetime
import os
import stat
from typing import Optional

from . import BAD_REQUEST, NOT_FOUND, TOO_LARGE


class FileProblem(Exception):
    """A file operation that cannot be done; ``kind`` is one of the agent's error kinds."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


def _absolute(path: str) -> str:
    if not path.startswith("/") or "\x00" in path:
        raise FileProblem(BAD_REQUEST, f"path must be absolute and without NUL bytes: {path!r}")
    return path


def read(path: str, limit: int) -> bytes:
    """The whole file; refuses directories and files larger than ``limit``."""
    try:
        with open(_absolute(path), "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise FileProblem(BAD_REQUEST, f"{path} is not a regular file")
            data = f.read(limit + 1)
    except (FileNotFoundError, NotADirectoryError) as e:
        raise FileProblem(NOT_FOUND, f"File not found: {path}") from e
    except IsADirectoryError as e:
        raise FileProblem(BAD_REQUEST, f"{path} is a directory") from e
    except PermissionError as e:
        raise FileProblem(BAD_REQUEST, f"{path}: permission denied") from e
    if len(data) > limit:
        raise FileProblem(TOO_LARGE, f"{path} is larger than the {limit}-byte limit")
    return data


def write(path: str, data: bytes, mode: Optional[int]) -> None:
    """Create or replace the file, making missing parent directories."""
    _absolute(path)
    try:
        os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        if mode is not None:
            os.chmod(path, mode)
    except (FileNotFoundError, NotADirectoryError, FileExistsError) as e:
        raise FileProblem(NOT_FOUND, f"Cannot create {path}: a parent is missing or not a directory") from e
    except IsADirectoryError as e:
        raise FileProblem(BAD_REQUEST, f"{path} is a directory") from e
    except OSError as e:
        kind = TOO_LARGE if e.errno in (28, 27, 122) else BAD_REQUEST    # ENOSPC, EFBIG, EDQUOT
        raise FileProblem(kind, f"Cannot write {path}: {e.strerror}") from e


def listing(path: str) -> list:
    """Entries of one directory, sorted by name; symlinks are reported, never followed."""
    try:
        with os.scandir(_absolute(path)) as it:
            entries = [_entry(e) for e in it]
    except FileNotFoundError as e:
        raise FileProblem(NOT_FOUND, f"Directory not found: {path}") from e
    except NotADirectoryError as e:
        raise FileProblem(BAD_REQUEST, f"{path} is not a directory") from e
    except PermissionError as e:
        raise FileProblem(BAD_REQUEST, f"{path}: permission denied") from e
    return sorted((e for e in entries if e is not None), key=lambda e: e["name"])


def _entry(entry: os.DirEntry) -> Optional[dict]:
    try:
        st = entry.stat(follow_symlinks=False)
    except FileNotFoundError:
        return None                       # removed while listing
    if stat.S_ISLNK(st.st_mode):
        kind = "symlink"
    elif stat.S_ISDIR(st.st_mode):
        kind = "directory"
    else:
        kind = "file"
    modified = datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc).isoformat()
    return {"name": entry.name, "type": kind, "size": st.st_size, "modified": modified}
