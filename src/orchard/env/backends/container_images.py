"""Image names of the container backend: the `host` image built from this machine's packages, and snapshot references.

``host`` means what it means for the local backend (this machine's own programs) but as a real
OCI image: the files of a fixed set of Debian packages and their dependencies (bash, python3,
git, procps, iproute2, ...) plus a filtered copy of /etc, imported once through the engine API
and tagged with a digest of the package versions, so it is rebuilt only when they change.
"""

from __future__ import annotations

import fnmatch
import io
import hashlib
import json
import os
import re
import stat
import subprocess
import tarfile
import tempfile
import threading
from typing import Iterable, Optional

from orchard.env.backends.local_images import DEFAULT_PATH, ETC_SECRETS, MERGED_USR_LINKS, SKELETON_DIRS
from orchard.errors import BackendError

HOST_REPOSITORY = "localhost/orchard-host"
SNAPSHOT_REPOSITORY = "localhost/orchard-snapshots"
HOST_WORKDIR = "/workspace"
BUILD_VERSION = "2"            # bump when the image layout below changes
HOST_PACKAGES = ("base-files", "base-passwd", "bash", "dash", "coreutils", "debianutils", "diffutils", "findutils",
                 "grep", "sed", "gzip", "tar", "mawk", "less", "patch", "procps", "iproute2", "util-linux",
                 "ncurses-base", "ncurses-bin", "libc-bin", "hostname", "ca-certificates", "git", "python3")
SKIPPED_TREES = ("/usr/share/doc/", "/usr/share/man/", "/usr/share/info/", "/usr/share/locale/",
                 "/usr/share/lintian/", "/usr/share/bug/")
_lock = threading.Lock()


# ---------------------------------------------------------------- snapshot references
def snapshot_reference(name: str, scope: str = "") -> str:
    """A valid OCI reference for a snapshot name the service hands over (e.g. '@owner/name:tag').

    Injective by digest; ``scope`` (the service's tag) keeps two services sharing an engine apart."""
    readable = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40] or "snapshot"
    digest = hashlib.sha256(f"{scope}\0{name}".encode()).hexdigest()[:16]
    return f"{SNAPSHOT_REPOSITORY}/{scope + '-' if scope else ''}{readable}-{digest}:latest"


# ---------------------------------------------------------------- the host image
def host_reference(packages: Iterable[str] = HOST_PACKAGES) -> str:
    """The tag of the host image for the packages installed now (cheap: one dpkg-query)."""
    versions = _installed()
    closure = sorted(_closure(packages, versions))
    digest = hashlib.sha256(json.dumps([BUILD_VERSION, [(p, versions[p][0]) for p in closure]]).encode())
    return f"{HOST_REPOSITORY}:{digest.hexdigest()[:16]}"


def ensure_host_image(api, packages: Iterable[str] = HOST_PACKAGES) -> str:
    """The host image's reference, importing it through the engine API (``docker.APIClient``) when missing."""
    with _lock:
        ref = host_reference(packages)
        if _exists(api, ref):
            return ref
        with tempfile.TemporaryFile(prefix="orchard-host-") as tmp:
            with tarfile.open(fileobj=tmp, mode="w") as tar:
                _write_rootfs(tar, _files(sorted(_closure(packages, _installed()))))
            tmp.seek(0)
            changes = [f"WORKDIR {HOST_WORKDIR}", f"ENV PATH={DEFAULT_PATH}", "ENV LANG=C.UTF-8"]
            reply = api.import_image_from_file(tmp, repository=ref, changes=changes)
        if not _exists(api, ref):
            raise BackendError(f"Importing the host image {ref} failed: {str(reply)[-300:]}")
        return ref


def _exists(api, ref: str) -> bool:
    import docker.errors

    try:
        api.inspect_image(ref)
        return True
    except docker.errors.ImageNotFound:
        return False


def _installed() -> dict[str, tuple[str, str]]:
    """package -> (version, dependencies) of every installed Debian package."""
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f", "${Package}\t${Version}\t${db:Status-Abbrev}\t"
                              "${Pre-Depends}, ${Depends}\t${Provides}\n"], capture_output=True, text=True,
                             timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise BackendError(f"The 'host' image is built from Debian packages, and dpkg-query failed: {e}") from e
    found: dict[str, tuple[str, str]] = {}
    for line in out.splitlines():
        name, version, status, depends, provides = line.split("\t")
        if status.startswith("ii"):
            found[name] = (version, depends)
            for virtual in _names(provides):
                found.setdefault(virtual, (version, name))
    return found


def _names(field: str) -> list[str]:
    return [part.strip().split(" ")[0].split(":")[0] for part in field.split(",") if part.strip()]


def _closure(roots: Iterable[str], installed: dict[str, tuple[str, str]]) -> set[str]:
    """The packages among ``roots`` that are installed, with everything they depend on (first installed alternative)."""
    seen: set[str] = set()
    stack = [r for r in roots if r in installed]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        for group in installed[name][1].split(","):
            choice = next((a for a in _names(group.replace("|", ",")) if a in installed), None)
            if choice and choice not in seen:
                stack.append(choice)
    return seen


def _files(packages: list[str]) -> list[str]:
    """Canonical paths (merged /usr resolved, final component kept) of the packages' files, docs left out."""
    out = subprocess.run(["dpkg", "-L", *packages], capture_output=True, text=True, timeout=120).stdout
    paths = set()
    for line in out.splitlines():
        if not line.startswith("/") or line == "/." or any(line.startswith(t) for t in SKIPPED_TREES):
            continue
        parent, name = os.path.split(line)
        paths.add(os.path.join(os.path.realpath(parent), name))
    return sorted(paths)


def _write_rootfs(tar: tarfile.TarFile, files: list[str]) -> None:
    tar.orchard_names = set()        # every path once: engines refuse duplicate entries
    _add_dir(tar, ".", 0o755)        # without it the root is 0555, and capability-less root cannot write there
    for rel, mode in SKELETON_DIRS.items():
        _add_dir(tar, rel, mode)
    _add_dir(tar, HOST_WORKDIR.lstrip("/"), 0o755)
    for name in MERGED_USR_LINKS:
        if os.path.islink(f"/{name}") and _first(tar, name):
            link = tarfile.TarInfo(name)
            link.type, link.linkname = tarfile.SYMTYPE, os.readlink(f"/{name}")
            tar.addfile(link)
    for path in files:
        if not path.startswith("/etc/"):
            _add(tar, path)
    _add_etc(tar)


def _add_dir(tar: tarfile.TarFile, rel: str, mode: int) -> None:
    if not _first(tar, rel):
        return
    info = tarfile.TarInfo(rel)
    info.type, info.mode = tarfile.DIRTYPE, mode
    tar.addfile(info)


def _first(tar: tarfile.TarFile, rel: str) -> bool:
    if rel in tar.orchard_names:
        return False
    tar.orchard_names.add(rel)
    return True


def _add(tar: tarfile.TarFile, path: str) -> None:
    if not _first(tar, path.lstrip("/")):
        return
    try:
        info = tar.gettarinfo(path, arcname=path.lstrip("/"))
    except OSError:
        return                       # listed by dpkg but not on disk (excluded by dpkg's path filters)
    if info is None:
        return                       # a socket or similar
    info.mode &= ~(stat.S_ISUID | stat.S_ISGID)          # no_new_privs makes them useless; never ship them
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    if info.isfile():
        with open(path, "rb") as f:
            tar.addfile(info, f)
    else:
        tar.addfile(info)


def _add_etc(tar: tarfile.TarFile) -> None:
    """The host's /etc without its secrets (the local backend's rules) and with a fresh machine-id."""
    for top, dirs, files in os.walk("/etc"):
        rel_top = os.path.relpath(top, "/etc")
        dirs[:] = [d for d in dirs if not _secret(os.path.normpath(os.path.join(rel_top, d)), None)]
        _add(tar, top)
        for name in files:
            path = os.path.join(top, name)
            if not _secret(os.path.normpath(os.path.join(rel_top, name)), path):
                _add(tar, path)
    machine_id = (hashlib.sha256(os.urandom(16)).hexdigest()[:32] + "\n").encode()
    info = tarfile.TarInfo("etc/machine-id")
    info.size, info.mode = len(machine_id), 0o444
    tar.addfile(info, io.BytesIO(machine_id))


def _secret(rel: str, path: Optional[str]) -> bool:
    if rel == "machine-id" or any(fnmatch.fnmatch(rel, pattern) for pattern in ETC_SECRETS):
        return True
    if path is None or os.path.islink(path) or not os.path.isfile(path):
        return False
    if rel.endswith(".key"):
        return True
    if rel.endswith(".pem"):
        with open(path, "rb") as f:
            return b"PRIVATE KEY" in f.read(1 << 20)
    return False

